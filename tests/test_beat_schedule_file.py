"""Celery beat starts with a fresh schedule, and says so, whatever state its schedule file is in (core/beat.py).

A crash while beat writes its schedule can leave the shelve's index intact and its data file empty; Celery's own
recovery does not catch the EOFError that reading an entry then raises, and beat exited 1 on every start.
"""

import logging
import subprocess
from pathlib import Path

import pytest
from django.conf import settings

from config.celery import app
from core.beat import Scheduler
from testkit.harness import VENV_BIN
from testkit.processes import service_env
from testkit.waiting import wait_for

SWEEP_SENT = "Sending due task outbox-sweep"
FRESH = "starting with a fresh schedule"


def schedule_files(schedule: Path) -> list[Path]:
    """Return the files the shelve behind `schedule` is made of (one, or dbm.dumb's .dir, .dat and .bak)."""
    return sorted(path for path in schedule.parent.iterdir() if path.name.startswith(schedule.name))


def truncated(schedule: Path) -> None:
    """Empty the data a crash mid-write leaves unwritten: every file but the index (dbm.dumb's .dir and .bak)."""
    files = schedule_files(schedule)
    data = [path for path in files if path.suffix not in (".dir", ".bak")]
    assert data, files
    for path in data:
        path.write_bytes(b"")


def emptied(schedule: Path) -> None:
    for path in schedule_files(schedule):
        path.write_bytes(b"")


def garbled(schedule: Path) -> None:
    for path in schedule_files(schedule):
        path.write_bytes(bytes(range(256)) * 4)


DAMAGE = {"truncated": truncated, "emptied": emptied, "garbled": garbled}


def written_schedule(path: Path) -> None:
    """Write a schedule file as beat leaves it: its entries, then closed."""
    scheduler = Scheduler(app, schedule_filename=str(path))
    scheduler.close()
    assert "outbox-sweep" in scheduler_entries(path)


def scheduler_entries(path: Path) -> set[str]:
    scheduler = Scheduler(app, schedule_filename=str(path))
    try:
        return set(scheduler.schedule)
    finally:
        scheduler.close()


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_a_damaged_schedule_file_is_replaced_by_a_fresh_schedule_with_a_warning(tmp_path, caplog, damage):
    schedule = tmp_path / "beat-schedule"
    written_schedule(schedule)
    damage(schedule)

    with caplog.at_level(logging.WARNING, logger="core.beat"):
        entries = scheduler_entries(schedule)

    assert "outbox-sweep" in entries
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "core.beat"]
    assert len(warnings) == 1, warnings
    assert str(schedule) in warnings[0]
    assert FRESH in warnings[0]


def test_a_sound_schedule_file_and_a_first_start_warn_nothing(tmp_path, caplog):
    schedule = tmp_path / "beat-schedule"

    with caplog.at_level(logging.WARNING, logger="core.beat"):
        written_schedule(schedule)
        scheduler_entries(schedule)

    assert [r for r in caplog.records if r.name == "core.beat"] == []


def beat(schedule: Path, log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(
            [str(VENV_BIN / "celery"), "-A", "config", "beat", "-l", "INFO", "-s", str(schedule)],
            cwd=settings.BASE_DIR,
            env=service_env(OUTBOX_SWEEP_SECONDS="1"),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def run_until_a_sweep_is_sent(schedule: Path, log: Path) -> str:
    """Run beat until it sends a sweep, then kill it (a crash: its stop on SIGTERM is tests/test_beat_stop.py's) and
    return its log. Beat writes its schedule file as it starts, before the first sweep."""
    process = beat(schedule, log)
    try:
        wait_for(
            lambda: SWEEP_SENT in log.read_text(errors="replace") or process.poll() is not None,
            timeout=60,
            what="beat to send a sweep",
        )
        assert process.poll() is None, log.read_text(errors="replace")[-3000:]
    finally:
        process.kill()
        process.wait()
    return log.read_text(errors="replace")


@pytest.mark.slow
@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_beat_starts_and_sends_on_the_schedule_file_a_crashed_beat_left(tmp_path, damage):
    schedule = tmp_path / "beat-schedule"
    first = run_until_a_sweep_is_sent(schedule, tmp_path / "first.log")
    assert FRESH not in first
    assert all(path.stat().st_size > 0 for path in schedule_files(schedule)), schedule_files(schedule)
    damage(schedule)

    second = run_until_a_sweep_is_sent(schedule, tmp_path / "second.log")

    warning = next(line for line in second.splitlines() if FRESH in line)
    assert "WARNING" in warning
    assert str(schedule) in warning
