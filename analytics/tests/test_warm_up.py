"""The class archive's warm-up runs the job's own stages, so the archive follows the job when the job changes."""

import pytest

from analytics.warm_up import warm_up

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]


def test_the_warm_up_runs_the_jobs_analysis_and_checks_on_its_rows(spark):
    try:
        analysis = warm_up(spark)
        assert [(row["date"], row["orders"]) for row in analysis.collected["summary"]] == [("2026-01-02", 2)]
        found = {row["check"]: row["entity_id"] for row in analysis.collected["violations"]}
        # Order 2 has no outbox row; credit 2 is for an order that does not exist.
        assert found["order_without_log"] == "2" and found["orphan_credit"] == "2"
    finally:
        spark.catalog.clearCache()
