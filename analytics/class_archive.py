"""The driver JVM's class archive (Java's class data sharing): Spark's classes loaded once, mapped by every run.

A day's run spends a large part of its CPU starting the JVM: loading, parsing and verifying thousands of classes,
each looked up through the 280 jars of Spark's class path. A dynamic CDS archive
(`-XX:ArchiveClassesAtExit`, JDK 13+) keeps them parsed and verified in one file that later JVMs map
(`-XX:SharedArchiveFile`). Measured on the shared 2-core machine: starting a session and running one job took
18.8 CPU-seconds without it and 9.9 with it (docs/PERFORMANCE.md, "Nightly analytics").

`manage.py spark_class_archive` writes the archive once (after installing or upgrading pyspark or Java); the
nightly run maps it when it exists for the Java and pyspark it runs with, and runs as before when it does not.
A JVM that finds the archive unusable says so on stderr and starts without it, so a stale archive costs only time.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pyspark
from django.conf import settings

ARCHIVE_DIR = "creditshop-spark-classes"
WRITE_OPTION = "-XX:ArchiveClassesAtExit"
USE_OPTION = "-XX:SharedArchiveFile"


def archive_path() -> Path:
    """Return where the archive for this Java and this pyspark lives: the user's cache directory, since it belongs
    to the machine's Java and Python environment rather than to a run or a report directory.
    """
    java_home = os.environ.get("JAVA_HOME")
    java = Path(java_home, "bin", "java") if java_home else Path(shutil.which("java") or "java")
    # An archive is only valid for the JVM and class path that wrote it: name it after both.
    jvm = str(java.resolve().parent.parent).strip("/").replace("/", "_")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / ARCHIVE_DIR / f"pyspark-{pyspark.__version__}-{jvm}.jsa"


def archive_option() -> str:
    """Return the driver JVM option that maps the archive, or "" when none has been written."""
    path = archive_path()
    return f" {USE_OPTION}={path}" if path.is_file() else ""


def archive_write(*, timeout: int = 900) -> Path:
    """Run a small representative job in a new JVM that archives the classes it loaded; return the archive's path.

    The JVM writes the archive as it exits, which is after its Python process has ended; waiting for the end of
    its output streams waits for it. It writes to a temporary name, renamed into place once complete, so a run
    starting meanwhile never maps half a file.
    """
    path = archive_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    os.unlink(tmp)
    try:
        completed = subprocess.run(
            [sys.executable, "-m", "analytics.class_archive", tmp],
            cwd=settings.BASE_DIR,
            env={**os.environ, "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "config.settings")},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if completed.returncode != 0 or not Path(tmp).is_file():
            raise RuntimeError(f"the archiving JVM failed ({completed.returncode}): {completed.stderr[-2000:]}")
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def _warm_up(archive: str) -> None:
    """Start the job's session with the archive option and run what a nightly run runs, on a few rows."""
    # Run as `python -m analytics.class_archive` in a process of its own: Django is set up here, then the app.
    import django

    django.setup()
    from datetime import UTC, date, datetime

    from analytics import checks, jobs, transforms
    from analytics.extract import jdbc_source, read_daily_history
    from analytics.period import Period
    from analytics.schemas import CREDITS_SCHEMA, DEAD_LETTERS_SCHEMA, FIRST_ORDERS_SCHEMA, LOGS_SCHEMA, ORDERS_SCHEMA
    from analytics.spark import spark_session_create, tuning_for

    tuning = tuning_for(1)
    tuning["spark.driver.extraJavaOptions"] += f" {WRITE_OPTION}={archive}"
    spark = spark_session_create(tuning=tuning)
    try:
        day = date(2026, 1, 2)
        at = datetime(2026, 1, 2, 12, tzinfo=UTC)
        period = Period.ending(day)
        ctx = checks.CheckContext(period=period, as_of=at, grace_seconds=600)
        orders = spark.createDataFrame([(1, 1, 2, at), (2, 1, 3, at)], ORDERS_SCHEMA)
        logs = spark.createDataFrame([("t1", 1, "published", 1, at, at)], LOGS_SCHEMA)
        credits = spark.createDataFrame([(1, 1, 1, 4, at, None), (2, 1, 3, 5, at, at)], CREDITS_SCHEMA)
        orders, logs, credits = (
            jobs._by_order(orders, "id"),
            jobs._by_order(logs, "order_id"),
            jobs._by_order(credits, "order_id"),
        )
        dead_letters = spark.createDataFrame([], DEAD_LETTERS_SCHEMA)
        first_orders = spark.createDataFrame([(1, 1)], FIRST_ORDERS_SCHEMA)
        # A JDBC read, as the job's are (the table is the analytics app's own, in the orders database).
        history = read_daily_history(spark, jdbc_source("default"))
        checks.lookup_candidates(orders=orders, logs=logs, credits=credits, ctx=ctx).collect()
        user_daily = transforms.transform_user_daily(orders, credits, period).cache()
        daily = transforms.transform_daily_metrics(user_daily, orders, first_orders, period).cache()
        latency = transforms.transform_award_latency(credits, orders, period)
        violations = checks.transform_violations(
            checks.run_checks(orders=orders, logs=logs, credits=credits, dead_letters=dead_letters, ctx=ctx), keep=10
        )
        jobs.collect_together(
            daily=daily,
            distribution=transforms.transform_credit_distribution(user_daily),
            latency=transforms.transform_latency_summary(latency),
            credit_histogram=transforms.transform_credit_histogram(user_daily),
            latency_histogram=transforms.transform_latency_histogram(latency),
            top_users=transforms.transform_top_users(user_daily),
            trend=transforms.transform_trend(history, daily, period),
            violations=violations,
        )
        with tempfile.TemporaryDirectory(prefix="spark-class-archive-") as directory:
            dataset = f"{Path(directory).as_uri()}/user_daily_credits"
            user_daily.repartition("date").write.mode("overwrite").partitionBy("date").parquet(dataset)
    finally:
        spark.stop()


if __name__ == "__main__":
    _warm_up(sys.argv[1])
