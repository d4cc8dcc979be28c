"""The class archive's warm-up: a nightly run's stages on a few rows, in a JVM that archives the classes it loads.

`manage.py spark_class_archive` runs it as `python -m analytics.warm_up ARCHIVE` in a process of its own
(analytics/class_archive.py). It calls the job's own stages (analytics/jobs.py), so the archive holds the classes
a run loads, and follows the job when the job changes.
"""

import sys
import tempfile
from datetime import UTC, date, datetime
from pathlib import Path

if __name__ == "__main__":
    # Run as a script: Django is set up before the app's modules are imported.
    import django

    django.setup()

from pyspark.sql import SparkSession  # noqa: E402

from analytics import jobs  # noqa: E402
from analytics.checks import LOOKUP_CHECKS, CheckContext, lookup_candidates, run_checks  # noqa: E402
from analytics.class_archive import WRITE_OPTION  # noqa: E402
from analytics.extract import Extracted, read_daily_history  # noqa: E402
from analytics.jdbc import jdbc_source  # noqa: E402
from analytics.lookups import candidate_ranges  # noqa: E402
from analytics.period import Period  # noqa: E402
from analytics.schemas import (  # noqa: E402
    CREDITS_SCHEMA,
    DEAD_LETTERS_SCHEMA,
    FIRST_ORDERS_SCHEMA,
    LOGS_SCHEMA,
    ORDERS_SCHEMA,
)
from analytics.spark import spark_session_create, tuning_for  # noqa: E402


def warm_up(spark: SparkSession) -> jobs.Analysis:
    """Run what a nightly run runs, on a few rows: a JDBC read, the partitioning by order id, the look-ups' query,
    the analytics and checks collected in one job, and a partitioned Parquet write; return the analysis.
    """
    at = datetime(2026, 1, 2, 12, tzinfo=UTC)
    ctx = CheckContext(period=Period.ending(date(2026, 1, 2)), as_of=at, grace_seconds=600)
    data = Extracted(
        orders=spark.createDataFrame([(1, 1, 2, at), (2, 1, 3, at)], ORDERS_SCHEMA),
        logs=spark.createDataFrame([("t1", 1, "published", 1, at)], LOGS_SCHEMA),
        credits=spark.createDataFrame([(1, 1, 1, 4, at, None), (2, 1, 3, 5, at, at)], CREDITS_SCHEMA),
        dead_letters=spark.createDataFrame([], DEAD_LETTERS_SCHEMA),
        first_orders=spark.createDataFrame([(1, 1)], FIRST_ORDERS_SCHEMA),
        # A JDBC read, as the job's are (the table is the analytics app's own, in the orders database).
        history=read_daily_history(spark, jdbc_source("default")),
    )
    data = jobs.partition_by_order(data)
    results = run_checks(
        orders=data.orders, logs=data.logs, credits=data.credits, dead_letters=data.dead_letters, ctx=ctx
    )
    checked = {name: results[name].cache() for name in LOOKUP_CHECKS}
    candidate_ranges(lookup_candidates(checked))
    analysis = jobs.analyse(data, ctx=ctx, keep=10, checked=checked)
    with tempfile.TemporaryDirectory(prefix="spark-class-archive-") as directory:
        dataset = f"{Path(directory).as_uri()}/user_daily_credits"
        analysis.user_daily.repartition("date").write.mode("overwrite").partitionBy("date").parquet(dataset)
    return analysis


def main(archive: str) -> None:
    """Start the job's session with the option that writes the archive as the JVM exits, and warm it up."""
    tuning = tuning_for(1)
    tuning["spark.driver.extraJavaOptions"] += f" {WRITE_OPTION}={archive}"
    spark = spark_session_create(tuning=tuning)
    try:
        warm_up(spark)
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
