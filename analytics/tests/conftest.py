"""One SparkSession for every analytics test (starting a JVM costs seconds), and builders for small frames."""

import pytest
from pyspark.sql import DataFrame, SparkSession

from analytics.schemas import CREDITS_SCHEMA, DEAD_LETTERS_SCHEMA, LOGS_SCHEMA, ORDERS_SCHEMA
from analytics.spark import spark_session_create


@pytest.fixture(scope="session")
def spark() -> SparkSession:
    # Two cores and two shuffle partitions: test frames have a handful of rows.
    session = spark_session_create(master="local[2]", overrides={"spark.sql.shuffle.partitions": "2"})
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
