"""Writes for the analytics app's report tables: the staging table Spark fills, and replacing a period's rows.

The run itself (its lock and its history row) is recorded by analytics/runs.py.
"""

from collections.abc import Sequence

from django.db import connection, transaction

from analytics.models import CheckResult, DailyMetrics, NightlyRun, UserDailyCredits, Violation
from analytics.period import Period


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
