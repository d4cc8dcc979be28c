"""Fixtures for the Galera suite: one three-node cluster for the package (scripts/mariadb_cluster.sh, fixed ports), both
services' test databases migrated on it, and the test's connections pointed at its writer endpoint. When a test of the
package failed (or the cluster did not start), the nodes' and the endpoint's logs are kept under .run/galera-logs/.
"""

import contextlib
import os
import shutil
import time
import uuid
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connections
from rest_framework.test import APIClient

from accounts.services import api_token_create
from core.deadlines import INIT_COMMAND_KEY
from testkit.galera_cluster import KEPT_LOGS, GaleraCluster, cluster_directory
from testkit.lost_answer import LostAnswerProxy
from testkit.silence import drop_leftover_rules

ALIASES = ("default", "credits")
# Every connection of the tests and of the processes they start reads what the cluster committed before
# (config/settings.py, DATABASE_WSREP_SYNC_WAIT).
SYNC_WAIT = 1
# Where this session keeps the cluster's logs if they are kept, whether a test of the package failed, and the
# directory of the cluster the package stopped.
LOGS_DESTINATION = pytest.StashKey[Path]()
TEST_FAILED = pytest.StashKey[bool]()
STOPPED_CLUSTER = pytest.StashKey[GaleraCluster]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Note a failed test of the package (setup, call or teardown), and tell in its report where the logs will be."""
    report = yield
    if report.failed:
        item.session.stash[TEST_FAILED] = True
        destination = item.session.stash.get(LOGS_DESTINATION, None)
        if destination is not None:
            report.sections.append(("Galera cluster logs", f"kept under {destination} at the end of the session"))
    return report


def pytest_sessionfinish(session):
    """Keep the logs of the cluster the package stopped when a test of the package failed, then remove its directory.

    Here, not in the fixture's teardown: that runs within the last test's teardown, before a failure of that test's
    own teardown (a cluster that would not become whole again) is reported.
    """
    cluster = session.stash.get(STOPPED_CLUSTER, None)
    if cluster is None:
        return
    if session.stash.get(TEST_FAILED, False):
        destination = session.stash[LOGS_DESTINATION]
        kept = cluster.keep_logs(destination)
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"The Galera cluster's logs ({len(kept)} files) are kept under {destination}")
    shutil.rmtree(cluster.directory, ignore_errors=True)


@contextlib.contextmanager
def databases_on(cluster: GaleraCluster):
    """Point both aliases of this process at the same database names behind the cluster's endpoint, for a while."""
    host, port = cluster.endpoint
    saved = {}
    for alias in ALIASES:
        connection = connections[alias]
        settings_dict = connection.settings_dict
        saved[alias] = {key: settings_dict[key] for key in ("HOST", "PORT", "USER", "PASSWORD", INIT_COMMAND_KEY)}
        saved[alias]["OPTIONS"] = dict(settings_dict["OPTIONS"])
        connection.close()
        base = settings_dict[INIT_COMMAND_KEY]
        settings_dict[INIT_COMMAND_KEY] = f"{base}, wsrep_sync_wait={SYNC_WAIT}"
        init_command = settings_dict["OPTIONS"]["init_command"].replace(base, settings_dict[INIT_COMMAND_KEY], 1)
        settings_dict["OPTIONS"] = {**settings_dict["OPTIONS"], "init_command": init_command}
        settings_dict.update(HOST=host, PORT=str(port), USER="root", PASSWORD="")
    try:
        yield
    finally:
        for alias in ALIASES:
            connections[alias].close()
            connections[alias].settings_dict.update(saved[alias])


@pytest.fixture(scope="package")
def galera(request, django_db_setup, django_db_blocker):
    """A three-node cluster shared by the package's modules (its start and the migrations take about 15 s), both
    services' test databases migrated on it (DDL replicated by TOI).

    Its nodes' data goes when it stops, the rest of its directory at the end of the session, its logs kept first when
    a test of the package failed (its own start included): they tell what the nodes and the endpoint did.
    """
    drop_leftover_rules()
    cluster = GaleraCluster(cluster_directory())
    stash = request.session.stash
    stash[LOGS_DESTINATION] = KEPT_LOGS / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}"
    try:
        cluster.start()
        server = cluster.connect()
        for alias in ALIASES:
            name = connections[alias].settings_dict["NAME"]
            server.cursor().execute(
                f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
            )
        server.close()
        with django_db_blocker.unblock(), databases_on(cluster):
            for alias in ALIASES:
                call_command("migrate", database=alias, verbosity=0)
        yield cluster
    finally:
        with contextlib.suppress(Exception):
            cluster.stop()
        # The data (gcache files included) goes now; the logs wait for the session's last report.
        for data in cluster.directory.glob("gal*/data"):
            shutil.rmtree(data, ignore_errors=True)
        stash[STOPPED_CLUSTER] = cluster


@pytest.fixture
def on_galera(galera, transactional_db):
    """Run one test with both aliases on the cluster, whole again afterwards (every node started)."""
    galera.ensure_whole()
    with databases_on(galera):
        yield galera
    drop_leftover_rules()
    galera.ensure_whole()


@pytest.fixture
def galera_user(on_galera):
    """Return a function making a user on the cluster with a name no other test of the module used."""

    def make(prefix: str = "galera"):
        return get_user_model().objects.create_user(username=f"{prefix}-{uuid.uuid4().hex[:12]}")

    return make


@pytest.fixture
def proxy(on_galera):
    """A proxy in front of the endpoint that can lose or hold a COMMIT (testkit/lost_answer.py)."""
    with LostAnswerProxy(on_galera.endpoint) as proxy:
        yield proxy


@pytest.fixture
def client(galera_user):
    """A user of its own and an API client with that user's key."""
    user = galera_user("client")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {api_token_create(user=user)[1]}")
    return user, client
