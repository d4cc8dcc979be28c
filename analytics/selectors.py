"""Reads for the analytics app: run history and report rows."""

from datetime import date
from pathlib import Path

from django.conf import settings
from django.db.models import QuerySet

from analytics.models import CheckResult, NightlyRun, UserDailyCredits
from analytics.period import Period


def report_dir(day: date) -> Path:
    """Return the directory of a day's report files (the web reads it; the nightly job writes it)."""
    return Path(settings.REPORTS_DIR) / day.isoformat()


def run_list() -> QuerySet[NightlyRun]:
    """Return runs, newest first."""
    return NightlyRun.objects.order_by("-started_at", "-id")


def run_check_results(*, run: NightlyRun) -> QuerySet[CheckResult]:
    """Return a run's check results by day, then in docs/CONTRACT.md's order of checks (their insertion order)."""
    return run.check_results.order_by("date", "id")


def run_dates(*, run: NightlyRun) -> list[date]:
    """Return the days a run covered."""
    return Period.ending(run.date, days=run.days).dates


def user_daily_count(*, period: Period) -> int:
    """Return how many per-user-per-day rows the report table holds for the period."""
    return UserDailyCredits.objects.filter(date__gte=period.first, date__lte=period.last).count()


def run_last_finished() -> NightlyRun | None:
    """Return the newest run that ended, succeeded or failed (a running one has no verdict yet)."""
    return run_list().exclude(status=NightlyRun.Status.RUNNING).first()


def run_last_succeeded() -> NightlyRun | None:
    """Return the newest run that succeeded, whatever its checks found."""
    return run_list().filter(status=NightlyRun.Status.SUCCEEDED).first()
