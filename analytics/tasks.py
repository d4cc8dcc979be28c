"""Celery interface of the analytics app: the nightly run, started by beat, executed in a child process.

Spark starts a JVM and background threads; a prefork worker process is the wrong place for them (and for the
memory they take), so the task only launches `manage.py run_nightly_reports` and reports how it ended.

A worker's warm shutdown does not wait hours for it: the worker SIGTERMs the pool process running it
(core/worker.py, `interrupt_on_worker_shutdown`), which passes the signal on to the command. The command records
the run as interrupted, releases its lock and exits 75; the task then hands its message back to the queue, and the
next worker to start runs the day again.
"""

import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading

from billiard.process import current_process
from celery import shared_task
from celery.exceptions import Reject
from django.conf import settings

from core.contract import RUN_NIGHTLY_TASK

logger = logging.getLogger(__name__)


class NightlyRunFailed(Exception):
    pass


def nightly_command(*, date: str | None = None, repair: bool = False) -> list[str]:
    """Return the command line of one nightly run (default date: yesterday, decided by the command), at
    ANALYTICS_RUN_NICENESS: nice(1) execs the command, so the SIGTERM forwarded to its pid reaches the command."""
    command = [sys.executable, str(settings.BASE_DIR / "manage.py"), "run_nightly_reports"]
    if settings.ANALYTICS_RUN_NICENESS:
        command = ["nice", "-n", str(settings.ANALYTICS_RUN_NICENESS), *command]
    if date:
        command += ["--date", date]
    if repair:
        command.append("--repair")
    return command


@shared_task(name=RUN_NIGHTLY_TASK, ignore_result=True, interrupt_on_worker_shutdown=True)
def run_nightly(date: str | None = None, repair: bool = False) -> None:
    """Run the nightly reports in a subprocess; raise if it failed, so the failure shows in the worker's log.

    The command holds a per-day lock, so a redelivered message (acks are late) cannot start a second run for
    a day that is still running; it fails fast instead, and the run history shows the first run's outcome.
    Interrupted by the worker's shutdown, the message goes back to the queue (see the module's docstring).
    """
    command = nightly_command(date=date, repair=repair)
    logger.info("starting nightly reports: %s", " ".join(command[1:]))
    completed, stopping = run_forwarding_sigterm(command, timeout=settings.ANALYTICS_RUN_TIMEOUT_SECONDS)
    if completed.returncode == os.EX_TEMPFAIL and stopping:
        raise Reject("the nightly run was interrupted by the worker's shutdown; requeued", requeue=True)
    if completed.returncode != 0:
        raise NightlyRunFailed(f"run_nightly_reports exited {completed.returncode}: {completed.stderr[-2000:]}")
    logger.info("nightly reports finished: %s", completed.stdout.strip().splitlines()[-1:])


def run_forwarding_sigterm(command: list[str], *, timeout: float) -> tuple[subprocess.CompletedProcess, bool]:
    """Run a command to its end, passing a SIGTERM this process receives on to it; return how it ended and
    whether a SIGTERM came.

    Only the main thread can take signals (a prefork pool process, or a solo worker's); elsewhere the command just
    runs.
    """
    stopping = threading.Event()
    started: list[subprocess.Popen] = []

    def forward(signum, frame):
        stopping.set()
        for process in started:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        if chain:
            previous(signum, frame)

    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM)
    # In a prefork pool process the handler replaced here is billiard's, which ends the process at once: not called,
    # the task ends by itself. In a solo worker it is Celery's warm shutdown, which must still start.
    chain = callable(previous) and current_process().name == "MainProcess"
    # Installed before the command starts, so no SIGTERM can fall between the two.
    if in_main_thread:
        signal.signal(signal.SIGTERM, forward)
    try:
        # Output to files, not pipes: a pipe stays open, and the wait for its end lasts, as long as any process that
        # inherited it lives, and the command's Spark JVM may outlive the command.
        with (
            tempfile.TemporaryFile("w+") as stdout,
            tempfile.TemporaryFile("w+") as stderr,
            subprocess.Popen(command, cwd=settings.BASE_DIR, stdout=stdout, stderr=stderr, text=True) as process,
        ):
            started.append(process)
            if stopping.is_set():
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                raise
            stdout.seek(0)
            stderr.seek(0)
            output = subprocess.CompletedProcess(command, process.returncode, stdout.read(), stderr.read())
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)
    return output, stopping.is_set()
