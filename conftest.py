"""Fixtures shared by every app's tests: static files, users, authenticated API clients."""

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test.utils import override_settings
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient


@pytest.fixture(scope="session", autouse=True)
def static_root(tmp_path_factory):
    """Collect the static files once, so pages render through the manifest storage production uses."""
    root = tmp_path_factory.mktemp("static")
    with override_settings(STATIC_ROOT=root):
        call_command("collectstatic", interactive=False, verbosity=0)
        yield root


@pytest.fixture
def make_user(db):
    counter = iter(range(1, 1_000_000))

    def make(username: str | None = None, **extra):
        return get_user_model().objects.create_user(username=username or f"user{next(counter)}", **extra)

    return make


@pytest.fixture
def user(make_user):
    return make_user("alice")


@pytest.fixture
def other_user(make_user):
    return make_user("bob")


def token_client(user) -> APIClient:
    client = APIClient()
    token, _ = Token.objects.get_or_create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


@pytest.fixture
def api(user) -> APIClient:
    return token_client(user)


@pytest.fixture
def other_api(other_user) -> APIClient:
    return token_client(other_user)
