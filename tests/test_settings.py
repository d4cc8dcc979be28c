"""Settings come from the environment and a bad value stops start-up with a message naming the variable."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from config import env

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DJANGO_DEBUG", "maybe"),
        ("DATABASE_CONN_MAX_AGE", "ten"),
        ("OUTBOX_MAX_ATTEMPTS", "0"),
        ("ORDERS_RATE_LIMIT", "fast"),
        ("DATABASE_URL", "postgres://localhost/x"),
        ("OUTBOX_SWEEP_SECONDS", "-1"),
        ("IDEMPOTENCY_KEY_RETENTION_HOURS", "a day"),
        ("IDEMPOTENCY_KEY_RETENTION_HOURS", "0"),
        ("CELERY_QUEUE_TYPE", "mirrored"),
        ("CREDITS_OUTAGE_WAIT_SECONDS", "600"),
        ("CREDITS_OUTAGE_WAIT_SECONDS", "soon"),
        ("ORDER_MESSAGE_VERSION", "two"),
        ("ORDER_MESSAGE_VERSION", "3"),
        ("ORDER_MESSAGE_VERSION", "0"),
        ("CREDITS_ACCEPTED_MESSAGE_VERSIONS", "1,two"),
        ("CREDITS_ACCEPTED_MESSAGE_VERSIONS", "1,3"),
        ("CREDITS_ACCEPTED_MESSAGE_VERSIONS", ","),
        ("CREDITS_UNKNOWN_VERSION_WAIT_SECONDS", "-1"),
        ("CREDITS_UNKNOWN_VERSION_WAIT_SECONDS", "an hour"),
        ("CELERY_TASK_SOFT_TIME_LIMIT", "0"),
        ("CELERY_TASK_TIME_LIMIT", "soon"),
        ("CELERY_TASK_TIME_LIMIT", "300"),  # not above the soft limit (300 by default)
    ],
)
def test_bad_value_fails_start_up_naming_the_variable(name, value):
    result = subprocess.run(
        [sys.executable, "-c", "import django; from django.conf import settings; settings.DEBUG"],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", name: value},
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert name in result.stderr


@pytest.mark.parametrize(("raw", "expected"), [("1", True), ("YES", True), ("off", False), ("", True)])
def test_env_bool_accepts_usual_spellings(monkeypatch, raw, expected):
    monkeypatch.setenv("X_FLAG", raw)

    assert env.env_bool("X_FLAG", True) is expected


def test_env_rate(monkeypatch):
    monkeypatch.setenv("X_RATE", "none")
    assert env.env_rate("X_RATE", "20/second") is None
    monkeypatch.setenv("X_RATE", "5/minute")
    assert env.env_rate("X_RATE", "20/second") == "5/minute"
    monkeypatch.setenv("X_RATE", "0/second")
    with pytest.raises(ImproperlyConfigured, match="X_RATE"):
        env.env_rate("X_RATE", "20/second")


def test_env_int_set(monkeypatch):
    monkeypatch.delenv("X_VERSIONS", raising=False)
    assert env.env_int_set("X_VERSIONS", (1, 2), allowed=(1, 2)) == {1, 2}
    monkeypatch.setenv("X_VERSIONS", " 2 , 1,2 ")
    assert env.env_int_set("X_VERSIONS", (1,), allowed=(1, 2)) == {1, 2}
    monkeypatch.setenv("X_VERSIONS", "1")
    assert env.env_int_set("X_VERSIONS", (1, 2), allowed=(1, 2)) == {1}
    for bad in ("1,3", "one", ",", "1.5"):
        monkeypatch.setenv("X_VERSIONS", bad)
        with pytest.raises(ImproperlyConfigured, match="X_VERSIONS"):
            env.env_int_set("X_VERSIONS", (1, 2), allowed=(1, 2))


def test_database_url_is_parsed(monkeypatch):
    monkeypatch.setenv("X_DB", "mysql://app:secret@db.example:3307/shop")

    config = env.env_database("X_DB", "mysql://root:@127.0.0.1:3306/creditshop")

    assert (config["USER"], config["PASSWORD"], config["HOST"], config["PORT"], config["NAME"]) == (
        "app",
        "secret",
        "db.example",
        3307,
        "shop",
    )
