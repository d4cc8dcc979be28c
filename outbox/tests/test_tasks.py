"""Celery tasks and the relay_outbox command: sweep, retention, the beat schedule, --once and SIGTERM."""

import signal
import subprocess
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from config.celery import app
from outbox.models import TransactionLog
from outbox.services import messages_purge_published
from outbox.tasks import purge_published, relay, sweep
from outbox.tests.support import BASE_DIR, PYTHON
from testkit.processes import service_env

Status = TransactionLog.Status

pytestmark = pytest.mark.django_db(transaction=True)


def test_sweep_and_relay_tasks_publish_what_is_due(make_rows, credits_queue):
    ids = make_rows(7)
    assert sweep.apply().get() == 7
    more = make_rows(2)
    assert relay.apply().get() == 2
    assert relay.apply().get() == 0
    assert sorted(credits_queue.ids()) == sorted(ids + more)


@pytest.mark.django_db
def test_beat_runs_the_sweeper_and_retention_on_the_outbox_queue():
    schedule = app.conf.beat_schedule
    assert schedule["outbox-sweep"]["task"] == "outbox.sweep"
    assert schedule["outbox-sweep"]["schedule"] == settings.OUTBOX_SWEEP_SECONDS
    assert schedule["outbox-purge-published"]["task"] == "outbox.purge_published"
    for name in ("outbox.sweep", "outbox.relay", "outbox.purge_published"):
        assert name in app.tasks
        assert app.amqp.router.route({}, name)["queue"].name == "outbox"


@pytest.mark.django_db
def test_retention_deletes_only_old_published_rows_in_small_batches(make_rows):
    now = timezone.now()
    old = make_rows(5, status=Status.PUBLISHED, published_at=now - timedelta(days=8))
    recent = make_rows(2, status=Status.PUBLISHED, published_at=now - timedelta(days=6))
    old_pending = make_rows(1, created_at=now - timedelta(days=30))
    old_dead = make_rows(1, status=Status.DEAD, created_at=now - timedelta(days=30))

    with CaptureQueriesContext(connection) as queries:
        deleted = messages_purge_published(older_than=now - timedelta(days=7), batch_size=2)
    assert deleted == 5
    # 5 rows in batches of 2: three short DELETEs by primary key, never one unbounded statement.
    deletes = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("DELETE")]
    assert len(deletes) == 3
    assert all("`transaction_log`.`id` IN" in sql for sql in deletes)
    assert sorted(TransactionLog.objects.values_list("id", flat=True)) == sorted(recent + old_pending + old_dead)
    assert not TransactionLog.objects.filter(id__in=old).exists()
    assert purge_published.apply().get() == 0


def test_relay_outbox_once_prints_the_count(make_rows, credits_queue):
    make_rows(12)
    out = StringIO()
    call_command("relay_outbox", "--once", "--batch-size", "5", stdout=out)
    assert out.getvalue().strip() == "published 12"
    assert credits_queue.count() == 12


@pytest.mark.slow
def test_relay_outbox_loop_relays_new_rows_and_stops_cleanly_on_sigterm(make_rows, credits_queue):
    relay_process = subprocess.Popen(
        [PYTHON, "manage.py", "relay_outbox"],
        cwd=BASE_DIR,
        env=service_env(OUTBOX_IDLE_SECONDS="0.2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(1.0)
        ids = make_rows(40)
        assert credits_queue.wait_for(40, timeout=20) == 40
        relay_process.send_signal(signal.SIGTERM)
        out, err = relay_process.communicate(timeout=15)
    finally:
        if relay_process.poll() is None:
            relay_process.kill()
            relay_process.communicate()
    assert relay_process.returncode == 0, err
    assert out.strip() == "stopped; published 40"
    assert sorted(credits_queue.ids()) == ids


@pytest.mark.django_db
def test_the_beat_purge_logs_what_it_deleted_in_days(make_rows, settings, caplog):
    settings.OUTBOX_RETENTION_DAYS = 7
    make_rows(
        2, status=Status.PUBLISHED, published_at=timezone.now() - timedelta(days=settings.OUTBOX_RETENTION_DAYS + 1)
    )
    with caplog.at_level("INFO", logger="outbox.tasks"):
        assert purge_published.apply().get() == 2
    assert "purged 2 published rows older than 7 days" in caplog.text
