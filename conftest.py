"""Fixtures shared by every app's tests: users, authenticated API clients."""

import uuid

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient


@pytest.fixture(autouse=True)
def cache_of_its_own(settings):
    """Give each test its own key prefix in the shared Redis, so no throttle count leaks between tests or runs."""
    default = settings.CACHES["default"]
    settings.CACHES = {**settings.CACHES, "default": {**default, "KEY_PREFIX": f"test-{uuid.uuid4().hex}"}}


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
