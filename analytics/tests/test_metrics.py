"""The nightly run's gauges on /metrics, read from the run history at scrape time."""

from datetime import date, timedelta

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from analytics.models import NightlyRun

pytestmark = pytest.mark.django_db

NIGHTLY = ("creditshop_nightly_last_run_failed", "creditshop_nightly_last_success_timestamp_seconds")


def nightly_samples() -> dict[str, float]:
    body = Client().get("/metrics").content.decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
        if sample.name.startswith("creditshop_nightly_")
    }


def run(status: str, *, hours_ago: float, violations: int = 0) -> NightlyRun:
    finished = timezone.now() - timedelta(hours=hours_ago)
    return NightlyRun.objects.create(
        date=date(2026, 11, 20),
        status=status,
        started_at=finished - timedelta(minutes=1),
        finished_at=None if status == NightlyRun.Status.RUNNING else finished,
        violations=violations,
        ok=None if status != NightlyRun.Status.SUCCEEDED else violations == 0,
    )


def test_nothing_is_reported_before_any_run_finished():
    run(NightlyRun.Status.RUNNING, hours_ago=0)
    assert nightly_samples() == {}


def test_the_newest_success_gives_its_time_and_violations():
    run(NightlyRun.Status.SUCCEEDED, hours_ago=30, violations=0)
    newest = run(NightlyRun.Status.SUCCEEDED, hours_ago=2, violations=7)
    run(NightlyRun.Status.RUNNING, hours_ago=0)  # still running: no verdict yet, the last finished one stands

    assert nightly_samples() == {
        "creditshop_nightly_last_run_failed": 0.0,
        "creditshop_nightly_last_success_timestamp_seconds": newest.finished_at.timestamp(),
        "creditshop_nightly_violations": 7.0,
    }


def test_a_failed_run_after_a_success_is_the_verdict():
    success = run(NightlyRun.Status.SUCCEEDED, hours_ago=25)
    run(NightlyRun.Status.FAILED, hours_ago=1)

    samples = nightly_samples()

    assert samples["creditshop_nightly_last_run_failed"] == 1.0
    assert samples["creditshop_nightly_last_success_timestamp_seconds"] == success.finished_at.timestamp()


def test_runs_that_never_succeeded_report_success_at_time_zero():
    run(NightlyRun.Status.FAILED, hours_ago=1)

    samples = nightly_samples()

    assert samples == {
        "creditshop_nightly_last_run_failed": 1.0,
        "creditshop_nightly_last_success_timestamp_seconds": 0.0,
    }
