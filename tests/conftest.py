"""Fixtures for cross-app tests: the web app served by gunicorn on a free port, as a deployment runs it."""

import pytest

from testkit.harness import Cluster
from testkit.processes import free_port, service_env


@pytest.fixture(scope="module")
def live_web(django_db_setup, static_root, tmp_path_factory):
    """Gunicorn on the test database with production settings: DEBUG off, static files from the manifest."""
    cluster = Cluster(
        service_env=service_env(),
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
