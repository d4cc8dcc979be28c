"""Security review: production settings pass `check --deploy` and keep Django's password hashers, and API tokens never
reach the logs."""

import logging
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import global_settings
from django.contrib.auth.hashers import check_password, make_password
from django.test.utils import override_settings
from rest_framework.test import APIClient

from accounts.services import api_token_create
from config import settings as settings_module

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_check_deploy_is_clean_with_production_settings():
    env = {
        **os.environ,
        "DJANGO_DEBUG": "false",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "DJANGO_ALLOWED_HOSTS": "shop.example.com",
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_production_hashes_passwords_with_djangos_default_and_verifies_the_tests_cheap_hashes():
    # The tests' hasher (testkit/passwords.py) is theirs alone: the settings leave Django's PBKDF2 in place.
    assert not hasattr(settings_module, "PASSWORD_HASHERS")
    assert global_settings.PASSWORD_HASHERS[0] == "django.contrib.auth.hashers.PBKDF2PasswordHasher"
    # A password a test sets is one a service started with production's hashers accepts.
    encoded = make_password("operator-password-1")
    assert encoded.startswith("pbkdf2_sha256$1$")
    with override_settings(PASSWORD_HASHERS=global_settings.PASSWORD_HASHERS):
        assert check_password("operator-password-1", encoded) and not check_password("wrong", encoded)


@pytest.mark.usefixtures("committed_db")  # the order commits in its own transaction
def test_tokens_never_reach_the_logs(user, caplog):
    key = api_token_create(user=user)[1]
    good, bad = APIClient(), APIClient()
    good.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    bad.credentials(HTTP_AUTHORIZATION="Token 0123456789abcdef0123456789abcdef01234567")

    with caplog.at_level(logging.DEBUG):
        good.post("/api/orders/", {"goods_name": "book", "total": 1}, format="json")
        good.post("/api/orders/", {"goods_name": "", "total": 0}, format="json")
        good.get("/api/orders/999999/")
        bad.get("/api/orders/")

    assert caplog.records, "the requests above should have logged something (4xx warnings)"
    text = "\n".join(record.getMessage() + repr(record.__dict__) for record in caplog.records)
    assert key not in text
    assert "0123456789abcdef0123456789abcdef01234567" not in text
