"""Fixtures shared by every app's tests: users, authenticated API clients, a three-node RabbitMQ cluster."""

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient


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


@pytest.fixture(scope="session")
def rabbitmq_cluster(tmp_path_factory):
    """A three-node RabbitMQ cluster beside the system broker, started once (about a minute) for the session."""
    from tests.rabbitmq_cluster import RabbitCluster

    cluster = RabbitCluster(tmp_path_factory.mktemp("rabbitmq-cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
