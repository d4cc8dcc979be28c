"""/healthz and /metrics: outbox lag and dead rows from the database, relay counters across processes."""

import subprocess
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from core.metrics import build_registry
from outbox.models import TransactionLog
from outbox.tests.support import BASE_DIR, PYTHON
from testkit.processes import service_env

pytestmark = pytest.mark.django_db(transaction=True)


def samples(text: str) -> dict[str, float]:
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}


def test_healthz_reports_outbox_lag_and_dead_count(make_rows):
    make_rows(1, next_attempt_at=timezone.now() - timedelta(seconds=30))
    make_rows(1)
    make_rows(2, status=TransactionLog.Status.DEAD)
    make_rows(1, next_attempt_at=timezone.now() + timedelta(hours=1))  # backing off: not due, no lag

    body = Client().get("/healthz").json()

    assert 30 <= body["outbox"]["lag_seconds"] < 40
    assert body["outbox"]["dead"] == 2


@pytest.mark.django_db
def test_metrics_exposes_counters_and_the_lag_gauge(make_rows, credits_queue):
    make_rows(2, next_attempt_at=timezone.now() - timedelta(seconds=12))
    make_rows(1, status=TransactionLog.Status.DEAD)

    response = Client().get("/metrics")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    values = samples(response.content.decode())
    assert 12 <= values["outbox_lag_seconds"] < 20
    assert values["outbox_dead_messages"] == 1
    for counter in ("outbox_published_total", "outbox_publish_failures_total", "outbox_dead_total"):
        assert counter in values


@pytest.mark.slow
def test_counters_from_relay_processes_are_summed_in_multiprocess_mode(make_rows, credits_queue, tmp_path):
    make_rows(9)
    for batch in ("4", "100"):
        proc = subprocess.run(
            [PYTHON, "manage.py", "relay_outbox", "--once", "--batch-size", batch],
            cwd=BASE_DIR,
            env=service_env(PROMETHEUS_MULTIPROC_DIR=str(tmp_path)),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        make_rows(3)

    from prometheus_client import generate_latest

    values = samples(generate_latest(build_registry(multiprocess_dir=str(tmp_path))).decode())
    assert values["outbox_published_total"] == 12  # 9 from the first process, 3 from the second
    assert values["outbox_lag_seconds"] >= 0
