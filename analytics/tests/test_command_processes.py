"""The command as operators and Celery run it: a separate process, exit codes, and a Spark standalone cluster.

The cluster is started from the pyspark distribution on loopback (master and one worker), the same job runs
against it with SPARK_MASTER=spark://127.0.0.1:<port>, and everything started here is stopped, even on failure.
"""

import ast
import json
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connections
from django.utils import timezone

from analytics.models import NightlyRun
from demo.seed import seed_demo_data
from orders.models import Order
from testkit import spark_cluster
from testkit.processes import database_url, service_env
from testkit.workers import SPARK_PROCESSES_GROUP

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.xdist_group(SPARK_PROCESSES_GROUP),
]

DAY = timezone.now().date() - timedelta(days=1)


def command_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a run against this test's database (its rows are committed) and report directory."""
    defaults = {
        "REPORTS_DIR": str(tmp_path / "reports"),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
    }
    return service_env(**{**defaults, **extra})


def run_command(env: dict[str, str], *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return manage(env, "run_nightly_reports", *args, timeout=timeout)


def manage(env: dict[str, str], *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(settings.BASE_DIR / "manage.py"), *args],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def standalone_cluster(tmp_path):
    """A master and one two-core worker on loopback (testkit/spark_cluster.py), stopped after the test."""
    with spark_cluster.standalone_cluster(workers=1, cores=2, memory="1g", work_dir=tmp_path) as cluster:
        yield cluster


def test_the_job_runs_on_a_standalone_cluster(standalone_cluster, tmp_path):
    seed_demo_data(orders=500, days=2, users=20, end=DAY, seed=21)
    env = command_env(tmp_path, **standalone_cluster.job_env(executor_memory="512m"))
    completed = run_command(env, "--date", str(DAY))
    assert completed.returncode == 0, completed.stdout + completed.stderr[-3000:]
    assert f"on {standalone_cluster.url}" in completed.stdout
    assert f"master={standalone_cluster.url}" in completed.stdout
    report = json.loads((tmp_path / "reports" / str(DAY) / "consistency.json").read_text())
    assert report["ok"] is True
    placed = Order.objects.filter(created_at__date=DAY).count()
    analytics = json.loads((tmp_path / "reports" / str(DAY) / "analytics.json").read_text())
    assert analytics["orders"] == placed
    run = NightlyRun.objects.get()
    assert (run.status, run.spark_master, run.orders) == ("succeeded", standalone_cluster.url, placed)
    # The executors, not the driver, wrote the Parquet files: the worker kept a directory for the application.
    assert any((tmp_path / "work").iterdir())


@pytest.fixture
def one_database():
    """The URL of a new empty database for both services, as a small install has; dropped afterwards."""
    name = f"{connections['default'].settings_dict['NAME']}_one"
    with connections["default"].cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")
        cursor.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci")
    try:
        yield database_url("default", name=name)
    finally:
        with connections["default"].cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")


def test_in_one_database_the_planted_faults_are_found_and_the_run_exits_zero(one_database, tmp_path):
    """Both URLs name one database, as a small install has: migrate each alias and seed with planted faults; the run
    finds exactly those and exits 0 (violations are its findings)."""
    env = command_env(tmp_path, SPARK_MASTER="local[2]", DATABASE_URL=one_database, CREDITS_DATABASE_URL=one_database)
    for args in (("migrate",), ("migrate", "--database", "credits")):
        migrated = manage(env, *args, "--verbosity", "0")
        assert migrated.returncode == 0, migrated.stderr[-3000:]
    seeded = manage(
        env,
        "seed_demo_data",
        *("--orders", "300", "--days", "1", "--users", "10", "--end", str(DAY), "--seed", "9"),
        "--plant",
    )
    assert seeded.returncode == 0, seeded.stderr[-3000:]
    planted = {
        name: ast.literal_eval(ids) for name, ids in re.findall(r"^  (\w+): (\[.*?\])", seeded.stdout, re.MULTILINE)
    }
    assert planted["orphan_credit"] and planted["missing_credit"]

    found = run_command(env, "--date", str(DAY))
    assert found.returncode == 0, found.stdout + found.stderr[-3000:]
    report = json.loads((tmp_path / "reports" / str(DAY) / "consistency.json").read_text())
    assert {name: check["sample"] for name, check in report["checks"].items()} == planted
    counts = ", ".join(f"{name}={check['count']:,}" for name, check in report["checks"].items() if check["count"])
    assert re.search(rf"^{DAY}: [\d,]+ violations \({re.escape(counts)}\)$", found.stdout, re.MULTILINE), found.stdout
    assert "[5/8] look-ups outside the window done" in found.stdout  # per-stage progress
    # Spark's own start-up chatter stays out unless asked for (-v 2).
    assert "native-hadoop" not in found.stderr and "log4j profile" not in found.stderr, found.stderr[-3000:]
    assert "Using incubator modules" not in found.stderr, found.stderr[-3000:]
    # Nor warnings an operator cannot act on (a window over one kind's rows, a frame cached twice).
    assert " WARN " not in found.stderr, found.stderr[-3000:]


def test_a_run_that_cannot_read_exits_non_zero_and_records_where(tmp_path):
    """A run without its JDBC driver exits 1 and records the stage it failed in, on this test's own databases."""
    broken = run_command(
        command_env(tmp_path, SPARK_MASTER="local[2]", SPARK_JDBC_JAR=str(tmp_path / "missing.jar")),
        "--date",
        str(DAY),
    )
    assert broken.returncode == 1
    assert "nightly run failed" in broken.stderr
    failed = NightlyRun.objects.get()
    assert (failed.status, failed.stage) == ("failed", "extract: compare users in the databases")
    assert "ClassNotFoundException" in failed.error or "Driver" in failed.error


CALL_SITES_PROBE = """
import threading
import django
django.setup()
from pyspark.errors import utils
from pyspark.sql import functions as F
from analytics.spark import spark_session_create, tuning_for, with_class_archive
spark = spark_session_create(master="local[1]", tuning=with_class_archive(tuning_for(0)), verbose={verbose})
# The job's first DataFrame calls are made on extract threads, with no active session there.
first = threading.Thread(target=lambda: F.col("total").alias("units"))
first.start()
first.join()
print("recorded" if utils.is_debugging_enabled() else "not recorded")
spark.stop()
"""


@pytest.mark.parametrize(("verbose", "expected"), [(True, "recorded"), (False, "not recorded")])
def test_call_sites_are_recorded_in_a_verbose_run_only_whichever_thread_calls_first(tmp_path, verbose, expected):
    done = subprocess.run(
        [sys.executable, "-c", CALL_SITES_PROBE.format(verbose=verbose)],
        cwd=settings.BASE_DIR,
        env=command_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == expected
