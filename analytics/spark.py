"""The SparkSession the nightly job runs in: master and JDBC driver from settings, UTC everywhere, small defaults."""

import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from pyspark.errors import utils as pyspark_errors
from pyspark.sql import SparkSession

from analytics import class_archive
from analytics.jvm_output import child_stderr_filtered

APP_NAME = "creditshop-nightly"
# The JVM's default zone decides how the JDBC driver turns DATETIME values into instants; the rows hold UTC.
UTC_JAVA_OPTIONS = "-Duser.timezone=UTC -Dfile.encoding=UTF-8"
# Spark's start-up warnings out of the output unless asked for (run_nightly_reports -v 2); see the file.
QUIET_LOG4J_OPTION = f"-Dlog4j2.configurationFile=file:{Path(__file__).with_name('log4j2-quiet.properties')}"
# Up to this many orders in the read window, a run is short enough that the JIT's own work dominates: the driver
# JVM compiles with C1 only (far less compiler CPU than C1 then C2), collects with the serial collector (no G1
# threads for a heap that holds a day) and caches its frames uncompressed (gathering the compression statistics
# costs more than the memory saved). Measured at 1M orders on the shared 2-core machine, interleaved pairs
# (docs/PERFORMANCE.md, "Nightly analytics"): tiered C2 with G1 52.8-56.3 driver JVM CPU-seconds; C1 with serial
# GC 35.9-41.9; C1 with G1 39.7-40.7; C1, serial GC and uncompressed cache 32.8-34.6. Above it (10M) tiered C2
# pays off: C2's code runs the millions of rows of every stage faster, and compressed columns keep the cache in
# the heap.
SHORT_JOB_ROWS = 2_000_000
SHORT_JOB_CONF = {"spark.sql.inMemoryColumnarStorage.compressed": "false"}
SHORT_JOB_JAVA_OPTIONS = " -XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
# Up to this many, a run also skips code generation: compiling generated Java (Janino) costs more CPU than it saves
# on a few hundred thousand rows (a day's run under load: 49.9 -> 46.7 CPU-seconds without it), and Janino's name
# look-ups scan Spark's 280 jars; operators and expressions run interpreted. At 1M orders it costs more than it
# saves: interpreted, the same run took 59.5-63.9 driver JVM CPU-seconds against 35.9-41.9 with code generation
# (C1, serial GC both ways).
INTERPRETED_JOB_ROWS = 300_000
INTERPRETED_JOB_CONF = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}
# Rows per shuffle partition when sizing a run (capped by ANALYTICS_SHUFFLE_PARTITIONS, at least 2).
ROWS_PER_SHUFFLE_PARTITION = 250_000
# PySpark's own setting (pyspark.errors.utils): whether each DataFrame call records its Python call site in the JVM.
DATAFRAME_DEBUGGING = "spark.python.sql.dataFrameDebugging.enabled"


def tuning_for(rows: int) -> dict[str, str]:
    """Return Spark properties sized for a run that reads about `rows` orders (and as many outbox rows, credits)."""
    partitions = max(2, min(settings.ANALYTICS_SHUFFLE_PARTITIONS, -(-rows // ROWS_PER_SHUFFLE_PARTITION)))
    tuning = {"spark.sql.shuffle.partitions": str(partitions), "spark.driver.extraJavaOptions": UTC_JAVA_OPTIONS}
    if rows <= SHORT_JOB_ROWS:
        tuning |= SHORT_JOB_CONF
        tuning["spark.driver.extraJavaOptions"] += SHORT_JOB_JAVA_OPTIONS
        # On a cluster the executors do the work the driver does in local mode, in JVMs that live as briefly.
        tuning["spark.executor.extraJavaOptions"] = UTC_JAVA_OPTIONS + SHORT_JOB_JAVA_OPTIONS
    if rows <= INTERPRETED_JOB_ROWS:
        tuning |= INTERPRETED_JOB_CONF
    return tuning


def spark_conf(
    *,
    master: str | None = None,
    tuning: dict[str, str] | None = None,
    overrides: dict[str, str] | None = None,
    verbose: bool = False,
) -> dict[str, str]:
    """Return the Spark properties the job runs with: defaults, then `tuning`, SPARK_CONF, and `overrides`."""
    conf = {
        "spark.master": master or settings.SPARK_MASTER,
        "spark.app.name": APP_NAME,
        "spark.jars": settings.SPARK_JDBC_JAR,
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.extraJavaOptions": UTC_JAVA_OPTIONS,
        "spark.executor.extraJavaOptions": UTC_JAVA_OPTIONS,
        "spark.driver.memory": settings.SPARK_DRIVER_MEMORY,
        "spark.executor.memory": settings.SPARK_EXECUTOR_MEMORY,
        # A day is tens of thousands of rows: the default 200 shuffle partitions would be 200 near-empty tasks.
        "spark.sql.shuffle.partitions": str(settings.ANALYTICS_SHUFFLE_PARTITIONS),
        # Adaptive execution turns every shuffle of the job's one big query into a job of its own (61 jobs instead
        # of 10 for a day) and re-plans between them; the joins here run on inputs already partitioned and sorted
        # by order id, so there is nothing for it to improve: without it a day's analytics takes half the time.
        "spark.sql.adaptive.enabled": "false",
        # A rerun for a day replaces only that day's partitions of the Parquet datasets.
        "spark.sql.sources.partitionOverwriteMode": "dynamic",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "false",
        # PySpark 4 sends the Python call site of every Column and DataFrame call to the JVM, so an error can name
        # the line that built the failing expression: about a dozen py4j round trips per call (the active session,
        # the origin class by reflection, a setting, set and clear). The class archive's warm-up, a day's analysis
        # on a few rows, made 15,749 round trips with it and 6,989 without (docs/PERFORMANCE.md, "Nightly
        # analytics"). On with verbosity 2 (`run_nightly_reports -v 2`), for a run being debugged; an error names the
        # failing expression either way. spark_session_create makes PySpark read it.
        DATAFRAME_DEBUGGING: "true" if verbose else "false",
    }
    conf.update(tuning or {})
    for item in settings.SPARK_CONF:
        key, sep, value = item.partition("=")
        if not sep or not key.strip().startswith("spark."):
            raise ImproperlyConfigured(f"SPARK_CONF entry {item!r} is not spark.<property>=<value>")
        conf[key.strip()] = value.strip()
    conf.update(overrides or {})
    if not verbose:
        # The driver only: it is what prints to the console, and an executor on another machine lacks this file.
        conf["spark.driver.extraJavaOptions"] = f"{conf['spark.driver.extraJavaOptions']} {QUIET_LOG4J_OPTION}"
    return conf


def spark_session_create(
    *,
    master: str | None = None,
    tuning: dict[str, str] | None = None,
    overrides: dict[str, str] | None = None,
    verbose: bool = False,
) -> SparkSession:
    """Start a new SparkSession configured for the nightly job (the caller stops it)."""
    # py4j logs every gateway connection at INFO, including at interpreter exit when the streams are closed.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    builder = SparkSession.builder
    for key, value in spark_conf(master=master, tuning=tuning, overrides=overrides, verbose=verbose).items():
        builder = builder.config(key, value)
    if verbose:
        spark = builder.getOrCreate()
    else:
        # The driver JVM starts here (once per process): without the incubator-module warning on its stderr.
        with child_stderr_filtered():
            spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    # PySpark reads DATAFRAME_DEBUGGING once per process, at the first DataFrame call, from the session active on the
    # calling thread. The job's first calls are made on extract threads, where no session is active, which PySpark
    # reads as "off" whatever the setting: it reads it here instead, on the thread that started this session.
    pyspark_errors.is_debugging_enabled()
    return spark


def with_class_archive(tuning: dict[str, str] | None) -> dict[str, str]:
    """Return `tuning` with the driver mapping the class archive once written (analytics/class_archive.py)."""
    tuning = dict(tuning or {})
    driver_options = tuning.get("spark.driver.extraJavaOptions", UTC_JAVA_OPTIONS)
    tuning["spark.driver.extraJavaOptions"] = driver_options + class_archive.archive_option()
    return tuning


@contextmanager
def spark_session(*, tuning: dict[str, str] | None = None, verbose: bool = False) -> Iterator[SparkSession]:
    """Yield the active SparkSession if there is one (tests share one), else start one and stop it afterwards.

    A session started here maps the driver's class archive when one has been written (analytics/class_archive.py).
    """
    active = SparkSession.getActiveSession()
    if active is not None:
        yield active
        return
    spark = spark_session_create(tuning=with_class_archive(tuning), verbose=verbose)
    try:
        yield spark
    finally:
        spark.stop()


def spark_jvm_stop(*, grace_seconds: float = 5.0) -> int:
    """Stop the processes this process started (Spark's JVM): SIGTERM, then SIGKILL after a grace period.

    For a run cut short. A JVM whose session was never stopped (cut while it started, before pyspark even kept a
    handle on it) otherwise lingers after the driver is gone, running its shutdown hooks against the master, and
    holds the output pipes of whoever started the command. Return how many there were.
    """
    children = _child_pids()
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while (left := children & _child_pids()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(children)


def _child_pids() -> set[int]:
    """Return the pids of this process's live children (Linux /proc), without starting another one to ask."""
    own, children = os.getpid(), set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # The command name, in parentheses, may hold spaces: the fields after its closing one are fixed.
            state, parent = stat.read_text().rpartition(")")[2].split()[:2]
            if int(parent) == own and state != "Z":
                children.add(int(stat.parent.name))
    return children
