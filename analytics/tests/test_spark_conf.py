"""The Spark properties the job runs with: Spark's own start-up warnings stay out unless asked for; a short run
skips what only pays off on many rows; the class archive is mapped once written; a DataFrame call costs no call-site
round trips unless asked for."""

from pathlib import Path

import py4j.java_gateway
import pyspark
import pytest
from pyspark.errors import utils as pyspark_errors
from pyspark.sql import functions as F

from analytics import class_archive
from analytics.spark import DATAFRAME_DEBUGGING, QUIET_LOG4J_OPTION, spark_conf, tuning_for


def test_the_driver_gets_the_quiet_logging_profile_unless_verbose():
    quiet = spark_conf(tuning=tuning_for(1000))
    verbose = spark_conf(tuning=tuning_for(1000), verbose=True)

    driver = "spark.driver.extraJavaOptions"
    assert QUIET_LOG4J_OPTION in quiet[driver] and "-Duser.timezone=UTC" in quiet[driver]
    assert QUIET_LOG4J_OPTION not in verbose[driver]
    assert QUIET_LOG4J_OPTION not in quiet["spark.executor.extraJavaOptions"]  # executors log on their own machines
    profile = Path(QUIET_LOG4J_OPTION.split("file:", 1)[1]).read_text()
    assert "org.apache.spark.util.Utils" in profile and "org.apache.hadoop.util.NativeCodeLoader" in profile


def test_a_started_session_maps_the_class_archive_only_once_written(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert class_archive.archive_option() == ""

    path = class_archive.archive_path()
    assert path.is_relative_to(tmp_path) and f"pyspark-{pyspark.__version__}-" in path.name
    path.parent.mkdir(parents=True)
    path.write_bytes(b"")
    assert class_archive.archive_option() == f" -XX:SharedArchiveFile={path}"


def test_a_small_day_runs_interpreted_a_million_keeps_code_generation_with_c1_and_ten_million_runs_tiered():
    small, million, ten_million = tuning_for(50_000), tuning_for(1_000_000), tuning_for(10_000_000)
    driver = "spark.driver.extraJavaOptions"

    assert small["spark.sql.codegen.wholeStage"] == "false"
    assert "-XX:TieredStopAtLevel=1" in small[driver] and "-XX:+UseSerialGC" in small[driver]
    assert "spark.sql.codegen.wholeStage" not in million
    assert "-XX:TieredStopAtLevel=1" in million[driver] and "-XX:+UseSerialGC" in million[driver]
    assert million["spark.sql.inMemoryColumnarStorage.compressed"] == "false"
    assert "spark.sql.codegen.wholeStage" not in ten_million
    assert "spark.sql.inMemoryColumnarStorage.compressed" not in ten_million
    assert "-XX:TieredStopAtLevel=1" not in ten_million[driver] and "-XX:+UseSerialGC" not in ten_million[driver]
    # A cluster's executors as the driver: short-lived at 1M, tiered at 10M.
    executor = "spark.executor.extraJavaOptions"
    assert "-XX:TieredStopAtLevel=1" in spark_conf(tuning=million)[executor]
    assert "-Duser.timezone=UTC" in spark_conf(tuning=million)[executor]
    assert "-XX:TieredStopAtLevel=1" not in spark_conf(tuning=ten_million)[executor]


def test_call_site_debugging_is_off_unless_verbose_and_spark_conf_can_turn_it_on(settings):
    assert spark_conf(tuning=tuning_for(1000))[DATAFRAME_DEBUGGING] == "false"
    assert spark_conf(tuning=tuning_for(1000), verbose=True)[DATAFRAME_DEBUGGING] == "true"
    settings.SPARK_CONF = [f"{DATAFRAME_DEBUGGING}=true"]
    assert spark_conf(tuning=tuning_for(1000))[DATAFRAME_DEBUGGING] == "true"


@pytest.mark.spark
def test_building_a_column_in_a_started_session_costs_no_call_site_round_trips(spark, monkeypatch):
    # PySpark decides once per process, at the first DataFrame call, and remembers: forget, so it asks this session.
    monkeypatch.setattr(pyspark_errors, "_enable_debugging_cache", None)
    assert pyspark_errors.is_debugging_enabled() is False
    sent = []
    send = py4j.java_gateway.GatewayClient.send_command

    def counted(client, command, *args, **kwargs):
        sent.append(command)
        return send(client, command, *args, **kwargs)

    monkeypatch.setattr(py4j.java_gateway.GatewayClient, "send_command", counted)

    F.col("total").cast("long").alias("units")

    assert not [command for command in sent if "PySparkCurrentOrigin" in command]
    # col, cast and alias: a call and a reflective look-up each (reference releases aside). With the call sites
    # recorded, each also looks up the active session, a setting and the origin class, and sets and clears it.
    calls = [command for command in sent if not command.startswith("m\n")]
    assert len(calls) <= 8, calls
