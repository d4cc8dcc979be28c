"""Fixtures for cross-app tests: the web app served by gunicorn on a free port, as a deployment runs it."""

import socket

import pytest
from django.conf import settings
from django.db import connection

from tests.reliability.harness import Cluster, database_url


def free_port() -> int:
    """Return a TCP port nobody listens on now (other test runs share this machine)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def live_web(django_db_setup, static_root, tmp_path_factory):
    """Gunicorn on the test database with production settings: DEBUG off, static files from the manifest."""
    cluster = Cluster(
        database_url=database_url(connection.settings_dict),
        broker_url=settings.CELERY_BROKER_URL,
        workdir=tmp_path_factory.mktemp("web"),
        port=free_port(),
        extra_env={
            "DJANGO_DEBUG": "false",
            # Plain HTTP on localhost: no redirect to HTTPS (the session cookie stays Secure; browsers allow
            # Secure cookies from localhost).
            "DJANGO_SECURE_SSL_REDIRECT": "false",
            "DJANGO_STATIC_ROOT": str(static_root),
        },
    )
    try:
        cluster.start("web")
        yield cluster
    finally:
        cluster.stop()
