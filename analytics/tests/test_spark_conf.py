"""The Spark properties the job runs with: Spark's own start-up warnings stay out unless asked for."""

from pathlib import Path

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
