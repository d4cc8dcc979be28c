"""The Celery side: beat's nightly entry, and the task that runs the command in a subprocess."""

import subprocess
import sys

import pytest
from celery.schedules import crontab

from analytics import tasks
from config.celery import app


def test_beat_runs_the_nightly_task_at_the_configured_utc_time():
    entry = app.conf.beat_schedule["analytics.run_nightly"]
    assert entry["task"] == "analytics.run_nightly"
    assert entry["schedule"] == crontab(hour=2, minute=0)
    assert app.conf.timezone == "UTC"
    assert "analytics.run_nightly" in app.tasks


def test_the_task_is_routed_to_its_own_queue_not_the_relays():
    assert app.amqp.router.route({}, "analytics.run_nightly")["queue"].name == "analytics"


def test_command_line(settings):
    assert tasks.nightly_command() == [sys.executable, str(settings.BASE_DIR / "manage.py"), "run_nightly_reports"]
    assert tasks.nightly_command(date="2026-11-20", repair=True)[-3:] == ["--date", "2026-11-20", "--repair"]


def test_a_failed_run_fails_the_task(monkeypatch):
    # Fault injection: the subprocess exits non-zero as a failed Spark job would.
    failed = subprocess.CompletedProcess(args=[], returncode=1, stdout="", stderr="CommandError: nightly run failed")
    monkeypatch.setattr(tasks, "run_forwarding_sigterm", lambda *a, **k: (failed, False))
    with pytest.raises(tasks.NightlyRunFailed, match="exited 1"):
        tasks.run_nightly.apply(kwargs={"date": "2026-11-20"}, throw=True)
