"""Every benchmark in bench/ runs, on the smallest load, against databases and a RabbitMQ vhost of its own.

The figures of docs/PERFORMANCE.md come from these scripts; one that no longer runs is found here, not in the next
benchmark round (bench_analytics.py once ran no size at all: tests/test_bench_analytics.py runs it end to end).
Nothing here judges speed: each bench exits non-zero on a wrong result (an order credited twice or not at all, a
non-2xx answer it does not expect, a row left unpublished), and that is what is asserted.
"""

import contextlib
import subprocess
import sys
from urllib.parse import quote, unquote, urlsplit

import MySQLdb
import pytest
from django.db import connections

from testkit.harness import ROOT
from testkit.processes import broker_url, database_address, database_url, service_env
from testkit.queues import rabbitmqctl

pytestmark = pytest.mark.slow

# The bench scripts get databases and a vhost of their own, as they purge queues and empty tables: named after this
# run's (this worker's) test database and vhost, so that runs and workers side by side never share them.
BENCH_SUFFIX = "_bench_smoke"

BENCHES = {
    "bench_auth": ["--rounds", "1", "-n", "50"],
    "bench_credits": ["--messages", "200", "--processes", "2", "--pool", "solo"],
    "bench_relay": ["--messages", "300", "--rate", "50", "--seconds", "2", "--repeat", "1"],
    "bench_relay_wake": ["--rounds", "1", "--seconds", "2", "--variants", "ours"],
    "bench_tracing": ["--awards", "50", "--rounds", "1"],
    "bench_e2e": ["--rate", "20", "--seconds", "2", "--skip-baseline"],
    # Each variant serves from a gunicorn of its own, two workers booting faster than the deployed four; one second of
    # load each (warm-up and run), over 20 users so the rate limit (20/s each) refuses none of what a second sends.
    "bench_orders": [
        *("--rounds", "1", "--seconds", "1", "--warm-up", "1", "--idle", "0.5", "--users", "20", "--workers", "2"),
        *("--variants", "ours,plain,bare"),
    ],
    # Enough orders that each step's CPU spans clock ticks (10 ms): at 20, a step of about 0.5 ms per operation could
    # read 0 and the bench's ratios divided by it.
    "bench_galera_writes": ["--orders", "200", "--rounds", "1", "--one-server-only"],
}


@pytest.fixture(scope="module")
def bench_env():
    """Return the environment of a bench run: both bench databases and the vhost created, removed afterwards."""
    orders_db = connections["default"].settings_dict["NAME"] + BENCH_SUFFIX
    credits_db = orders_db + "_credits"
    vhost = unquote(urlsplit(broker_url()).path[1:]) + BENCH_SUFFIX
    orders_url = database_url("default", name=orders_db)
    credits_url = database_url("credits", name=credits_db)
    env = service_env(
        DATABASE_URL=orders_url,
        CREDITS_DATABASE_URL=credits_url,
        BENCH_DATABASE_URL=orders_url,
        BENCH_CREDITS_DATABASE_URL=credits_url,
        CELERY_BROKER_URL=urlsplit(broker_url())._replace(path=f"/{quote(vhost, safe='')}").geturl(),
        DJANGO_DEBUG="false",
        LOG_LEVEL="WARNING",
    )
    host, port = database_address()
    server = MySQLdb.connect(host=host, port=port, user="root")
    try:
        vhost_delete(vhost)
        rabbitmqctl("add_vhost", vhost)
        rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        for name in (orders_db, credits_db):
            server.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
            server.cursor().execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci")
        for database in ("default", "credits"):
            subprocess.run(
                [sys.executable, "manage.py", "migrate", "--database", database, "--verbosity", "0"],
                cwd=ROOT,
                env=env,
                check=True,
                timeout=300,
            )
        yield env
    finally:
        for name in (orders_db, credits_db):
            server.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
        server.close()
        vhost_delete(vhost)


def vhost_delete(vhost: str) -> None:
    """Delete the bench vhost if it is there (an earlier run that was killed may have left it)."""
    with contextlib.suppress(subprocess.CalledProcessError):
        rabbitmqctl("delete_vhost", vhost)


@pytest.mark.parametrize("bench", BENCHES)
def test_the_bench_runs_on_the_smallest_load(bench, bench_env):
    completed = subprocess.run(
        [sys.executable, f"bench/{bench}.py", *BENCHES[bench]],
        cwd=ROOT,
        env=bench_env,
        capture_output=True,
        text=True,
        timeout=400,
    )

    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "Traceback" not in completed.stderr
