"""The Spark properties the job runs with: Spark's own start-up warnings stay out unless asked for; a short run
skips what only pays off on many rows; the class archive is mapped once written."""

from pathlib import Path

import pyspark

from analytics import class_archive
from analytics.spark import QUIET_LOG4J_OPTION, spark_conf, tuning_for


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
