"""The nightly run's lifecycle, in one place: the per-day lock, the run's history row, its stages, its outcome.

`nightly_run` is what the command (and so the Celery task) calls: it takes the lock, records the run, runs the
job's stages (analytics/jobs.run_stages) with their progress, and records success with the counts, failure with the
stage and traceback, or an interruption (SIGTERM, under `interrupt_on_sigterm`). The job's work itself (Spark,
loads) knows nothing of locks or history rows.
"""

import contextlib
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, datetime

import MySQLdb
from django.conf import settings
from django.db import connection, connections
from django.utils import timezone

from analytics import jobs
from analytics.models import NightlyRun
from analytics.period import Period
from analytics.results import DayResult
from core.errors import ApplicationError


class RunLocked(ApplicationError):
    status = 409


class RunInterrupted(BaseException):
    """SIGTERM arrived during a run. A BaseException, like KeyboardInterrupt, so no `except Exception` swallows it."""


@dataclass
class RunOutcome:
    run: NightlyRun
    days: list[DayResult]


def nightly_run(*, period: Period, repair: bool, write: Callable[[str], None], verbose: bool = False) -> RunOutcome:
    """Run the nightly job for the period under its lock, recording the run; raise RunLocked if a day is taken.

    Any failure is recorded on the run (stage and traceback) and raised again; so is an interruption, as such.
    Leaving this block releases the lock, whatever ended the run.
    """
    with run_lock(period=period):
        run = run_start(period=period, repair=repair, spark_master=settings.SPARK_MASTER)
        write(f"nightly run #{run.pk} for {period} on {settings.SPARK_MASTER}")
        progress = Progress(run=run, write=write, stages=jobs.stage_count(repair_requested=repair))
        try:
            days = jobs.run_stages(run=run, period=period, repair_requested=repair, progress=progress, verbose=verbose)
        except BaseException as exc:
            # The signal may have stopped Spark first (a whole process group is signalled), so the error that
            # surfaces can be Spark's; the flag says what happened.
            if isinstance(exc, RunInterrupted) or interrupted():
                run_interrupt(run=run)
            else:
                run_fail(run=run, error=exc)
            raise
        run_succeed(
            run=run,
            orders=sum(day.metrics["orders"] for day in days),
            credits=sum(day.metrics["credits_awarded"] for day in days),
            violations=sum(day.violations for day in days),
            ok=all(day.ok for day in days),
            reenqueued=sum(day.repair.reenqueued for day in days if day.repair),
            repair_summary={str(day.date): day.repair.as_dict() for day in days if day.repair},
        )
    return RunOutcome(run=run, days=days)


class Progress:
    """Prints each stage with its duration and what it did, and records the stage on the run."""

    def __init__(self, *, run: NightlyRun, write: Callable[[str], None], stages: int) -> None:
        self.run = run
        self.write = write
        self.stages = stages
        self.index = 0

    @contextmanager
    def stage(self, name: str) -> Iterator[dict]:
        self.index += 1
        run_stage(run=self.run, stage=name)
        started = time.monotonic()
        self.write(f"[{self.index}/{self.stages}] {name} ...")
        facts: dict = {}
        yield facts
        detail = ", ".join(f"{k}={v:,}" if isinstance(v, int) else f"{k}={v}" for k, v in facts.items())
        self.write(f"[{self.index}/{self.stages}] {name} done in {time.monotonic() - started:.1f}s {detail}".rstrip())


_interrupted = threading.Event()


def interrupted() -> bool:
    """Tell whether SIGTERM arrived during the current `interrupt_on_sigterm` block."""
    return _interrupted.is_set()


@contextmanager
def interrupt_on_sigterm(*, on_signal: Callable[[], object] = lambda: None) -> Iterator[None]:
    """Turn the first SIGTERM into RunInterrupted in the main thread; ignore further ones while the run records it.

    The exception comes out of whatever the main thread was waiting on (a query, a Spark call), the run is recorded
    as interrupted and its lock released on the way out, and the command exits 75. Python runs a signal handler only
    when the main thread next runs Python code, and a Spark call can block it for minutes (a JVM retrying its
    master) when the signal landed on another thread; so a watcher thread, woken by the signal itself
    (`signal.set_wakeup_fd`), calls `on_signal` at once: the command stops Spark's JVM there, which ends the call.
    """

    def interrupt(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _interrupted.set()
        raise RunInterrupted(f"signal {signal.Signals(signum).name}")

    def watch(read_fd: int) -> None:
        with os.fdopen(read_fd, "rb") as wakeups:
            while received := wakeups.read(1):
                if received[0] == signal.SIGTERM:
                    _interrupted.set()
                    on_signal()
                    return

    _interrupted.clear()
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous_handler = signal.signal(signal.SIGTERM, interrupt)
    previous_fd = signal.set_wakeup_fd(write_fd)
    threading.Thread(target=watch, args=(read_fd,), name="sigterm-watch", daemon=True).start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous_fd)
        signal.signal(signal.SIGTERM, previous_handler)
        os.close(write_fd)  # ends the watcher if no SIGTERM came


def lock_name(day: date) -> str:
    """Name of the server-wide lock for one day's run, scoped to this database (GET_LOCK names are global)."""
    return f"creditshop:{connection.settings_dict['NAME']}:nightly:{day.isoformat()}"[:64]


@contextmanager
def run_lock(*, period: Period) -> Iterator[None]:
    """Hold a MariaDB named lock for every day of the period, or raise RunLocked at once.

    The locks live on a connection of their own, so they last exactly as long as this block or this process:
    a run that crashes or is killed releases them with its connection, and nothing is left to clean up. On the way
    out they are released by a statement before the connection closes: the server frees a closed connection's locks
    when its thread gets to the disconnect, after the client has moved on, so a run started right after this one
    could otherwise still find its day locked.
    """
    db = connections["default"].settings_dict
    holder = MySQLdb.connect(
        host=db.get("HOST") or "127.0.0.1",
        port=int(db.get("PORT") or 3306),
        user=db.get("USER") or "root",
        password=db.get("PASSWORD") or "",
        database=db["NAME"],
        connect_timeout=5,
    )
    try:
        cursor = holder.cursor()
        for day in period.dates:
            cursor.execute("SELECT GET_LOCK(%s, 0)", [lock_name(day)])
            if cursor.fetchone()[0] != 1:
                raise RunLocked(f"another nightly run for {day} is in progress")
        yield
    finally:
        with contextlib.suppress(MySQLdb.Error):
            holder.cursor().execute("SELECT RELEASE_ALL_LOCKS()")
        holder.close()


def run_start(*, period: Period, repair: bool, spark_master: str, as_of: datetime | None = None) -> NightlyRun:
    """Record a new run; call it while holding run_lock for the period.

    Runs still marked running for these days cannot be alive (they would hold the lock): their process died,
    so they are marked failed.
    """
    now = timezone.now()
    NightlyRun.objects.filter(status=NightlyRun.Status.RUNNING, date__gte=period.first).filter(
        date__lte=period.last
    ).update(status=NightlyRun.Status.FAILED, finished_at=now, error="abandoned: its process ended without finishing")
    return NightlyRun.objects.create(
        date=period.last,
        days=period.days,
        repair=repair,
        spark_master=spark_master,
        started_at=now,
        as_of=as_of or now,
    )


def run_stage(*, run: NightlyRun, stage: str) -> None:
    """Record which stage a running run is in."""
    NightlyRun.objects.filter(pk=run.pk, status=NightlyRun.Status.RUNNING).update(stage=stage)
    run.stage = stage


def run_succeed(
    *,
    run: NightlyRun,
    orders: int,
    credits: int,
    violations: int,
    ok: bool,
    reenqueued: int = 0,
    repair_summary: dict | None = None,
) -> NightlyRun:
    """Mark a running run succeeded with its counts."""
    finished = timezone.now()
    fields = {
        "status": NightlyRun.Status.SUCCEEDED,
        "stage": "done",
        "finished_at": finished,
        "duration_seconds": (finished - run.started_at).total_seconds(),
        "orders": orders,
        "credits": credits,
        "violations": violations,
        "ok": ok,
        "reenqueued": reenqueued,
        "repair_summary": repair_summary or {},
    }
    if not NightlyRun.objects.filter(pk=run.pk, status=NightlyRun.Status.RUNNING).update(**fields):
        raise ApplicationError(f"run {run.pk} is no longer running")
    for name, value in fields.items():
        setattr(run, name, value)
    return run


def run_fail(*, run: NightlyRun, error: BaseException) -> None:
    """Mark a running run failed, keeping the stage it failed in and the traceback."""
    _run_end(run=run, status=NightlyRun.Status.FAILED, error="".join(traceback.format_exception(error))[-20_000:])


def run_interrupt(*, run: NightlyRun) -> None:
    """Mark a running run interrupted, keeping the stage it was in."""
    _run_end(
        run=run,
        status=NightlyRun.Status.INTERRUPTED,
        error="interrupted by SIGTERM (a stop or restart); run it again for the same date",
    )


def _run_end(*, run: NightlyRun, status: NightlyRun.Status, error: str) -> None:
    finished = timezone.now()
    NightlyRun.objects.filter(pk=run.pk, status=NightlyRun.Status.RUNNING).update(
        status=status,
        finished_at=finished,
        duration_seconds=(finished - run.started_at).total_seconds(),
        error=error,
    )
    run.status = status
