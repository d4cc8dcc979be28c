"""The Spark properties the job runs with: Spark's own start-up warnings stay out unless asked for."""

from pathlib import Path

from analytics.spark import QUIET_LOG4J_OPTION, spark_conf, tuning_for


def test_the_quiet_logging_profile_is_passed_to_driver_and_executors_unless_verbose():
    quiet = spark_conf(tuning=tuning_for(1000))
    verbose = spark_conf(tuning=tuning_for(1000), verbose=True)

    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        assert QUIET_LOG4J_OPTION in quiet[key] and "-Duser.timezone=UTC" in quiet[key]
        assert QUIET_LOG4J_OPTION not in verbose[key]
    profile = Path(QUIET_LOG4J_OPTION.split("file:", 1)[1]).read_text()
    assert "org.apache.spark.util.Utils" in profile and "org.apache.hadoop.util.NativeCodeLoader" in profile
