"""The Celery side: beat's nightly entry, and the task that runs the command in a subprocess."""

import os
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
    manage = [sys.executable, str(settings.BASE_DIR / "manage.py"), "run_nightly_reports"]
    assert settings.ANALYTICS_RUN_NICENESS == 10
    assert tasks.nightly_command() == ["nice", "-n", "10", *manage]
    assert tasks.nightly_command(date="2026-11-20", repair=True)[-3:] == ["--date", "2026-11-20", "--repair"]
    settings.ANALYTICS_RUN_NICENESS = 0
    assert tasks.nightly_command() == manage


def test_the_run_yields_the_cores_and_still_takes_the_forwarded_sigterm(settings):
    # The task's command line with manage.py replaced by a child that reports its niceness and parent, then sends this
    # process (its parent) the SIGTERM a worker's shutdown would: nice(1) must exec the child (its parent is us), or
    # the forwarded SIGTERM would stop nice and orphan the run.
    settings.ANALYTICS_RUN_NICENESS = 7
    prefix = tasks.nightly_command()[:3]
    child = (
        "import os, signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(75));"
        f" print(os.nice(0) - {os.nice(0)}, os.getppid(), flush=True); os.kill(os.getppid(), signal.SIGTERM);"
        " time.sleep(60)"
    )
    completed, stopping = tasks.run_forwarding_sigterm([*prefix, sys.executable, "-c", child], timeout=60)
    niceness, parent = map(int, completed.stdout.split())
    assert (niceness, parent, completed.returncode, stopping) == (7, os.getpid(), 75, True)


def test_a_failed_run_fails_the_task(monkeypatch):
    # Fault injection: the subprocess exits non-zero as a failed Spark job would.
    failed = subprocess.CompletedProcess(args=[], returncode=1, stdout="", stderr="CommandError: nightly run failed")
    monkeypatch.setattr(tasks, "run_forwarding_sigterm", lambda *a, **k: (failed, False))
    with pytest.raises(tasks.NightlyRunFailed, match="exited 1"):
        tasks.run_nightly.apply(kwargs={"date": "2026-11-20"}, throw=True)
