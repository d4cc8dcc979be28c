"""The SparkSession the nightly job runs in: master and JDBC driver from settings, UTC everywhere, small defaults."""

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from pyspark.sql import SparkSession

APP_NAME = "creditshop-nightly"
# The JVM's default zone decides how the JDBC driver turns DATETIME values into instants; the rows hold UTC.
UTC_JAVA_OPTIONS = "-Duser.timezone=UTC -Dfile.encoding=UTF-8"


def spark_conf(*, master: str | None = None, overrides: dict[str, str] | None = None) -> dict[str, str]:
    """Return the Spark properties the job runs with; SPARK_CONF entries, then `overrides`, replace defaults."""
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
        "spark.sql.adaptive.enabled": "true",
        # A rerun for a day replaces only that day's partitions of the Parquet datasets.
        "spark.sql.sources.partitionOverwriteMode": "dynamic",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "false",
    }
    for item in settings.SPARK_CONF:
        key, sep, value = item.partition("=")
        if not sep or not key.strip().startswith("spark."):
            raise ImproperlyConfigured(f"SPARK_CONF entry {item!r} is not spark.<property>=<value>")
        conf[key.strip()] = value.strip()
    conf.update(overrides or {})
    return conf


def spark_session_create(*, master: str | None = None, overrides: dict[str, str] | None = None) -> SparkSession:
    """Start a new SparkSession configured for the nightly job (the caller stops it)."""
    # py4j logs every gateway connection at INFO, including at interpreter exit when the streams are closed.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    builder = SparkSession.builder
    for key, value in spark_conf(master=master, overrides=overrides).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


@contextmanager
def spark_session(*, master: str | None = None) -> Iterator[SparkSession]:
    """Yield the active SparkSession if there is one (tests share one), else start one and stop it afterwards."""
    active = SparkSession.getActiveSession()
    if active is not None:
        yield active
        return
    spark = spark_session_create(master=master)
    try:
        yield spark
    finally:
        spark.stop()
