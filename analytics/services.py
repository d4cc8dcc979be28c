"""Writes for the analytics app: the run lock, run history, and replacing a day's report rows."""

import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import date, datetime

import MySQLdb
from django.db import connection, connections, transaction
from django.utils import timezone

from analytics.models import CheckResult, DailyMetrics, NightlyRun, UserDailyCredits, Violation
from analytics.period import Period
from core.errors import ApplicationError


class RunLocked(ApplicationError):
    status = 409


def lock_name(day: date) -> str:
    """Name of the server-wide lock for one day's run, scoped to this database (GET_LOCK names are global)."""
    return f"creditshop:{connection.settings_dict['NAME']}:nightly:{day.isoformat()}"[:64]


@contextmanager
def run_lock(*, period: Period) -> Iterator[None]:
    """Hold a MariaDB named lock for every day of the period, or raise RunLocked at once.

    The locks live on a connection of their own, so they last exactly as long as this block or this process:
    a run that crashes or is killed releases them with its connection, and nothing is left to clean up.
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
    finished = timezone.now()
    NightlyRun.objects.filter(pk=run.pk, status=NightlyRun.Status.RUNNING).update(
        status=NightlyRun.Status.FAILED,
        finished_at=finished,
        duration_seconds=(finished - run.started_at).total_seconds(),
        error="".join(traceback.format_exception(error))[-20_000:],
    )
    run.status = NightlyRun.Status.FAILED


def stage_table_create(*, run: NightlyRun) -> str:
    """Create an empty copy of the per-user-per-day table for Spark to fill; return its name."""
    name = f"{UserDailyCredits._meta.db_table}_stage_{run.pk}"
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {name}")
        cursor.execute(f"CREATE TABLE {name} LIKE {UserDailyCredits._meta.db_table}")
    return name


def stage_table_drop(*, name: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {name}")


def report_tables_replace(
    *,
    run: NightlyRun,
    period: Period,
    stage_table: str,
    metrics: Sequence[DailyMetrics],
    check_results: Sequence[CheckResult],
    violations: Sequence[Violation],
) -> None:
    """Replace the period's report rows with this run's, one transaction per day: readers see a day old or new.

    One transaction per day rather than for the whole period: replacing a month of per-user rows (3 million at the
    bench's 5x size) in one transaction took minutes of undo-log churn on a small buffer pool. Rows are copied in
    key order, so the unique (date, user_id) index is appended to rather than split at random.
    """
    user_table = UserDailyCredits._meta.db_table
    columns = ", ".join(f.column for f in UserDailyCredits._meta.concrete_fields if not f.primary_key)
    for day in period.dates:
        with transaction.atomic():
            UserDailyCredits.objects.filter(date=day).delete()
            with connection.cursor() as cursor:
                # Both names are ours (the model's table and stage_table_create's); nothing comes from input.
                cursor.execute(
                    f"INSERT INTO {user_table} ({columns}) SELECT {columns} FROM {stage_table}"  # noqa: S608
                    " WHERE date = %s ORDER BY user_id",
                    [day],
                )
            DailyMetrics.objects.filter(date=day).delete()
            DailyMetrics.objects.bulk_create([m for m in metrics if m.date == day])
            CheckResult.objects.filter(run=run, date=day).delete()
            CheckResult.objects.bulk_create([r for r in check_results if r.date == day])
            Violation.objects.filter(run=run, date=day).delete()
            Violation.objects.bulk_create([v for v in violations if v.date == day], batch_size=5_000)
