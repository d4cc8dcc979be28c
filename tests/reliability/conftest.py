"""Fixtures for the fault-injection suite: a cluster of real processes on the test databases and broker.

The credits service's test database lives on a second MariaDB server of its own (testkit/mariadb_server.py), so a
fault can take the credits database down while the order service's stays up. Each worker and the relay log in
with a user that has privileges on its own service's tables only (testkit/database_users.py).
"""

import contextlib

import pytest
from django.core.management import call_command
from django.db import connections

from testkit.database_users import ProcessUsers
from testkit.harness import Cluster
from testkit.mariadb_server import MariaDBServer
from testkit.processes import free_port, service_env
from testkit.queues import purge_queues

CREDITS = "credits"


@contextlib.contextmanager
def credits_database_on(server: MariaDBServer):
    """Point the `credits` alias of this process at the same database name on `server`, as root, for a while."""
    connection = connections[CREDITS]
    saved = {key: connection.settings_dict[key] for key in ("HOST", "PORT", "USER", "PASSWORD")}
    connection.close()
    connection.settings_dict.update(HOST="127.0.0.1", PORT=str(server.port), USER="root", PASSWORD="")
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict.update(saved)


@pytest.fixture(scope="session")
def credits_server(django_db_setup, django_db_blocker):
    """A second MariaDB server, started once per session, holding the credits test database (migrated there)."""
    server = MariaDBServer(port=free_port())
    try:
        server.install()
        server.start()
        server.create_database(connections[CREDITS].settings_dict["NAME"])
        with django_db_blocker.unblock(), credits_database_on(server):
            call_command("migrate", database=CREDITS, verbosity=0)
        yield server
    finally:
        server.remove()


@pytest.fixture
def credits_on_second_server(credits_server, transactional_db):
    """Run one test with the credits database on the second server, emptied afterwards."""
    with credits_database_on(credits_server):
        yield credits_server
        if credits_server.pid is None:  # a test that failed mid-outage
            credits_server.start()
        call_command("flush", database=CREDITS, interactive=False, verbosity=0)


@pytest.fixture
def process_users(credits_on_second_server):
    """One MariaDB user per process, each with privileges on its own service's tables only; dropped afterwards."""
    users = ProcessUsers()
    users.create()
    yield users
    if credits_on_second_server.pid is None:  # a test that failed mid-outage
        credits_on_second_server.start()
    users.drop()


@pytest.fixture
def cluster(process_users, transactional_db, tmp_path):
    purge_queues()
    cluster = Cluster(
        service_env=service_env(), workdir=tmp_path, port=free_port(), process_env=process_users.cluster_env()
    )
    try:
        yield cluster
    finally:
        cluster.stop()
        purge_queues()
