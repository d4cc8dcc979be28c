"""One SparkSession for every analytics test (starting a JVM costs seconds), and builders for small frames."""

import pytest
from pyspark.sql import DataFrame, SparkSession

from analytics.schemas import CREDITS_SCHEMA, DEAD_LETTERS_SCHEMA, LOGS_SCHEMA, ORDERS_SCHEMA
from analytics.spark import spark_session_create, tuning_for, with_class_archive


@pytest.fixture(scope="session")
def spark() -> SparkSession:
    # Tuned as production tunes a run of a handful of rows (two shuffle partitions, C1 and the serial collector,
    # interpreted operators), on two cores, with the class archive when one is written: the tests run the
    # configuration a small day runs with, and their JVM costs what a small day's does.
    session = spark_session_create(master="local[2]", tuning=with_class_archive(tuning_for(0)))
    yield session
    session.stop()


@pytest.fixture
def frames(spark):
    """Build the extract-shaped frames from tuples in schema order."""

    class Frames:
        def orders(self, *rows) -> DataFrame:
            return spark.createDataFrame(list(rows), ORDERS_SCHEMA)

        def logs(self, *rows) -> DataFrame:
            return spark.createDataFrame(list(rows), LOGS_SCHEMA)

        def credits(self, *rows) -> DataFrame:
            # A row without its last field, ordered_at, is a credit from a version-1 message (ordered_at NULL).
            width = len(CREDITS_SCHEMA.fields)
            return spark.createDataFrame([row + (None,) * (width - len(row)) for row in rows], CREDITS_SCHEMA)

        def dead_letters(self, *rows) -> DataFrame:
            return spark.createDataFrame(list(rows), DEAD_LETTERS_SCHEMA)

    return Frames()


@pytest.fixture
def reports(settings, tmp_path):
    """Reports written under the test's own directory, no Parquet."""
    settings.REPORTS_DIR = tmp_path / "reports"
    settings.ANALYTICS_PARQUET_URL = ""
    return settings.REPORTS_DIR
