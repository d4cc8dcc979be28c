"""Celery interface of the analytics app: the nightly run, started by beat, executed in a child process.

Spark starts a JVM and background threads; a prefork worker process is the wrong place for them (and for the
memory they take), so the task only launches `manage.py run_nightly_reports` and reports how it ended.
"""

import logging
import subprocess
import sys

from celery import shared_task
from django.conf import settings

from core.contract import RUN_NIGHTLY_TASK

logger = logging.getLogger(__name__)


class NightlyRunFailed(Exception):
    pass


def nightly_command(*, date: str | None = None, repair: bool = False) -> list[str]:
    """Return the command line of one nightly run (default date: yesterday, decided by the command)."""
    command = [sys.executable, str(settings.BASE_DIR / "manage.py"), "run_nightly_reports"]
    if date:
        command += ["--date", date]
    if repair:
        command.append("--repair")
    return command


@shared_task(name=RUN_NIGHTLY_TASK, ignore_result=True)
def run_nightly(date: str | None = None, repair: bool = False) -> None:
    """Run the nightly reports in a subprocess; raise if it failed, so the failure shows in the worker's log.

    The command holds a per-day lock, so a redelivered message (acks are late) cannot start a second run for
    a day that is still running; it fails fast instead, and the run history shows the first run's outcome.
    """
    command = nightly_command(date=date, repair=repair)
    logger.info("starting nightly reports: %s", " ".join(command[1:]))
    completed = subprocess.run(
        command,
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=settings.ANALYTICS_RUN_TIMEOUT_SECONDS,
        check=False,
    )
    if completed.returncode != 0:
        raise NightlyRunFailed(f"run_nightly_reports exited {completed.returncode}: {completed.stderr[-2000:]}")
    logger.info("nightly reports finished: %s", completed.stdout.strip().splitlines()[-1:])
