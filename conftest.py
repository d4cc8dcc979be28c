"""Fixtures shared by every app's tests: static files, users, API and admin clients, both services' databases for
each test, a three-node RabbitMQ cluster, what keeps parallel workers apart (testkit/workers.py), and what keeps a
run's processes from outliving it (testkit/leftovers.py), and the fault tests' accounts of their runs
(testkit/summaries.py)."""

import functools
import hashlib
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.contrib.staticfiles import finders
from django.core.management import call_command
from django.test import Client
from django.test.utils import override_settings
from rest_framework.test import APIClient

from accounts.services import api_token_create
from testkit import bytecode, committed, leftovers, passwords
from testkit.workers import (
    SPARK_GROUP,
    SharedServicesLock,
    runs_alone,
    with_vhost,
    worker_count,
    worker_id,
    worker_vhost,
)

# The `summary` fixture and the run's closing list of what the fault tests saw.
pytest_plugins = ("testkit.summaries",)

DATABASE_FIXTURES = {"db", "transactional_db", "live_server", "django_db_reset_sequences"}
# Its command test stops every child of the test process (the nightly command's interrupted path), a SparkSession's
# JVM included: on the Spark worker it runs, as in a serial run, before the session starts (pytest-django orders the
# database tests first).
STOPS_CHILD_PROCESSES = {"analytics.tests.test_interrupt"}
RUN_DIR = Path(__file__).resolve().parent / ".run"
# What an operator holds to use every admin action: retry and discard outbox rows, replay and discard dead letters.
OPERATOR_PERMISSIONS = (
    "outbox.view_transactionlog",
    "outbox.manage_outbox",
    "credits.view_deadletter",
    "credits.replay_deadletter",
)


OWN_MARK = pytest.StashKey[str]()

bytecode.cache_in_checkout()


@pytest.fixture(scope="session", autouse=True)
def fast_password_hashing():
    """Passwords hashed at one PBKDF2 iteration in the test processes (testkit/passwords.py); production keeps
    Django's default hashers (tests/test_security.py)."""
    with override_settings(PASSWORD_HASHERS=passwords.PASSWORD_HASHERS):
        yield


def pytest_configure(config):
    """Mark this test process, so every process its tests start can be told apart from any other run's."""
    config.stash[OWN_MARK] = leftovers.mark_this_process()


def pytest_sessionstart(session):
    """Stop what an earlier run, interrupted, left running: it would write into the test databases this run makes."""
    if hasattr(session.config, "workerinput"):
        return  # the run's first process did it before starting its workers
    report(session.config, "Stopped processes an earlier test run left running", leftovers.stop_orphans())


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    """Stop, and name, what this process's tests started and did not stop (last: after the session's fixtures were
    torn down, as they are when a run stops at its first failure; a parallel run's first process runs no test)."""
    mark = session.config.stash.get(OWN_MARK, None)
    if mark is not None and not session.config.pluginmanager.has_plugin("dsession"):
        report(session.config, "Stopped processes the tests left running", leftovers.stop_own(mark, os.getpgid(0)))


def report(config, title: str, processes: list) -> None:
    if not processes:
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"{title} ({leftovers.LOG}):\n{leftovers.describe(processes)}", yellow=True)


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):
    """Refuse to start on test databases another process is connected to: it would write into them under the tests
    (a service an earlier run left behind, another run on the same names). Named, with the process, at once."""
    from django.db import connections

    for alias in connections:
        names = [connections[alias].creation._get_test_db_name()]
        deadline = time.monotonic() + 15  # a process stopped at the session's start takes a moment to disconnect
        while found := leftovers.foreign_connections(alias, names):
            if time.monotonic() > deadline:
                pytest.exit(
                    f"Another process is connected to the test database {names[0]}; stop it, or give this run "
                    "other database names (DATABASE_URL, CREDITS_DATABASE_URL):\n  " + "\n  ".join(found),
                    returncode=3,
                )
            time.sleep(0.5)


# A wrapper: its marks are made before `-m` deselects (a Spark test must already be slow then) and its order is
# the last word, after pytest-django's own.
@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(items):
    """Mark every Spark test (marked `spark` or using the session) slow, and open both databases to database tests.

    A SparkSession starts a JVM (seconds, and a core while it warms up), so `-m "not slow"` leaves Spark out
    without each module having to say so.

    Most flows cross both databases: an order is placed in one and credited in the other. pytest-django otherwise
    opens only `default`; a test of a single service states that by passing `databases` to its own django_db mark,
    and keeps its other options.

    On parallel workers, the Spark tests and each module with a module-scoped fixture (a gunicorn, a checkout) run on
    one worker (`xdist_group`), and the run starts with the groups and the slow tests: a test of minutes (the alert
    rules' own windows, a rollout) started last would leave the other workers idle until it ends, while the fast tests
    fill the gaps at the end.
    """
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if item.module.__name__ in STOPS_CHILD_PROCESSES and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(SPARK_GROUP))
        if item.get_closest_marker("spark") or "spark" in fixtures:
            if not item.get_closest_marker("slow"):
                item.add_marker(pytest.mark.slow)
            if not item.get_closest_marker("xdist_group"):
                item.add_marker(pytest.mark.xdist_group(SPARK_GROUP))
        if not item.get_closest_marker("xdist_group") and module_scoped_fixtures(item):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
        marker = item.get_closest_marker("django_db")
        if marker is None and not DATABASE_FIXTURES & fixtures:
            continue
        kwargs = dict(marker.kwargs) if marker else {}
        if "databases" in kwargs:
            continue
        item.add_marker(
            pytest.mark.django_db(*(marker.args if marker else ()), databases="__all__", **kwargs), append=False
        )
    yield
    if worker_id() is not None:
        # Stable: a group's tests keep their order, and a module's module-scoped fixture starts once.
        items.sort(key=run_order)


def run_order(item: pytest.Item) -> int:
    """Return where a test goes in a parallel run: the groups, the slow tests, the fast ones."""
    if item.get_closest_marker("xdist_group"):
        return 0
    return 1 if item.get_closest_marker("slow") else 2


def module_scoped_fixtures(item: pytest.Item) -> list[str]:
    """Return the module-scoped fixtures an item uses: its module then runs on one worker, so they start once."""
    definitions = getattr(item, "_fixtureinfo", None)
    if definitions is None:
        return []
    return [name for name, defs in definitions.name2fixturedefs.items() if defs and defs[-1].scope == "module"]


@functools.cache
def services_lock() -> SharedServicesLock:
    """This worker's side of the cross-worker lock (testkit/workers.py)."""
    return SharedServicesLock(RUN_DIR / "locks")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Run each test, its fixtures' set-up and tear-down included, holding the shared-services lock: exclusively for
    a test marked `alone`, and for one marked `paired` in a run of more than PAIRED workers (its bounds are measured
    beside one other test, no more); shared for every other test."""
    if worker_id() is None:
        return (yield)
    if runs_alone((mark.name for mark in item.iter_markers()), worker_count()):
        with services_lock().exclusive():
            return (yield)
    with services_lock().shared():
        return (yield)


@pytest.fixture(scope="session", autouse=True)
def worker_services():
    """Give a parallel worker its own RabbitMQ vhost and cache key prefix, in this process and every child it starts.

    pytest-django already gives each worker its own test databases; the broker URL reaches children through
    testkit.processes.service_env, the key prefix through the environment they inherit.
    """
    worker = worker_id()
    if worker is None:
        yield
        return
    from config.celery import app
    from testkit.queues import rabbitmqctl

    vhost = worker_vhost(django_settings.CELERY_BROKER_URL, worker)
    if vhost not in rabbitmqctl("-q", "list_vhosts", "--no-table-headers").splitlines():
        rabbitmqctl("add_vhost", vhost)
        rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    url = with_vhost(django_settings.CELERY_BROKER_URL, vhost)
    prefix = f"{django_settings.CACHE_KEY_PREFIX}-{worker}"
    django_settings.CELERY_BROKER_URL = url
    app.conf.broker_url = url
    django_settings.CACHE_KEY_PREFIX = prefix
    django_settings.CACHES = {
        **django_settings.CACHES,
        "default": {**django_settings.CACHES["default"], "KEY_PREFIX": prefix},
    }
    os.environ.update(CELERY_BROKER_URL=url, CACHE_KEY_PREFIX=prefix)
    yield


@pytest.fixture(autouse=True)
def breakers_closed():
    """Start and leave each test with every fail-fast breaker closed: a test that made a dependency fail must not make
    the next one's calls fail at once (core/breaker.py)."""
    from core.cache import cache_breaker
    from core.mysql.base import breakers_reset

    cache_breaker.reset()
    breakers_reset()
    yield
    cache_breaker.reset()
    breakers_reset()


@pytest.fixture(autouse=True)
def cache_of_its_own(settings):
    """Give each test its own key prefix in the shared Redis, so no throttle count leaks between tests or runs."""
    default = settings.CACHES["default"]
    settings.CACHES = {**settings.CACHES, "default": {**default, "KEY_PREFIX": f"test-{uuid.uuid4().hex}"}}


def static_sources_key() -> str:
    """Return a digest of the static storage settings and every source file's path, size and modification time."""
    digest = hashlib.sha256(repr((django_settings.STATIC_URL, django_settings.STORAGES["staticfiles"])).encode())
    for finder in finders.get_finders():
        for path, storage in sorted(finder.list([]), key=lambda found: found[0]):
            stat = os.stat(storage.path(path))
            digest.update(f"{storage.path(path)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="session", autouse=True)
def static_root():
    """Collected static files, so pages render through the manifest storage production uses.

    Collecting hashes and compresses every file (2-6 s, each run paid it); a collection is kept under
    .run/test-static/ for as long as the sources it was made from are unchanged.
    """
    cache = Path(__file__).resolve().parent / ".run" / "test-static"
    root = cache / static_sources_key()
    if not (root / "staticfiles.json").exists():
        cache.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=cache, prefix="collecting-"))
        with override_settings(STATIC_ROOT=staging):
            call_command("collectstatic", interactive=False, verbosity=0)
        try:
            staging.rename(root)
        except OSError:  # another run collected the same sources first
            shutil.rmtree(staging)
        for old in cache.iterdir():
            if old != root and not old.name.startswith("collecting-"):
                shutil.rmtree(old, ignore_errors=True)
    with override_settings(STATIC_ROOT=root):
        yield root


@pytest.fixture
def committed_db(transactional_db):
    """Database access outside any test case's transaction, as production has it: what the test writes commits. For a
    test of a write that commits in its own transaction (an order: orders/services.order_create refuses to run in
    another's). Afterwards only the tables holding rows are emptied, not every table (testkit/committed.py)."""
    yield
    committed.teardown_cheaply()


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
    """Return an API client sending a new API key of `user`'s in `Authorization: Token <key>`."""
    client = APIClient()
    _, key = api_token_create(user=user, name="test")
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


@pytest.fixture
def api(user) -> APIClient:
    return token_client(user)


@pytest.fixture
def other_api(other_user) -> APIClient:
    return token_client(other_user)


@pytest.fixture
def throttle_clock_stopped(monkeypatch) -> float:
    """Stop the order throttle's clock at now and return it: its windows are fixed, aligned to the clock, so a turn of
    the window between two of a test's requests would start a new count, and Retry-After counts whole seconds."""
    from orders.apis import OrderThrottle

    now = time.time()
    monkeypatch.setattr(OrderThrottle, "timer", lambda self: now)
    return now


@pytest.fixture
def make_staff_client(make_user):
    """Return a function giving a test client logged in as a new staff user holding `permissions` ("app.codename")."""

    def make(username: str, *permissions: str) -> Client:
        user = make_user(username, is_staff=True)
        for permission in permissions:
            app_label, codename = permission.split(".")
            user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
        client = Client()
        client.force_login(user)
        return client

    return make


@pytest.fixture
def staff_client(make_staff_client) -> Client:
    """A client logged into the admin as "operator", staff with every permission the admin actions need."""
    return make_staff_client("operator", *OPERATOR_PERMISSIONS)


@pytest.fixture(scope="session")
def rabbitmq_cluster(tmp_path_factory):
    """A three-node RabbitMQ cluster beside the system broker, started once (about a minute) for the session."""
    from testkit.rabbitmq_cluster import RabbitCluster

    cluster = RabbitCluster(tmp_path_factory.mktemp("rabbitmq-cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
