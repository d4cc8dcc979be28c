"""Writing a run's results: Parquet datasets, MySQL report tables, and each day's JSON and HTML files.

Every write replaces what an earlier run wrote for the same days and nothing else: Parquet by dynamic partition
overwrite, MySQL by deleting and inserting the days in one transaction, files by atomic rename.
"""

import json
import os
import tempfile
from datetime import date, datetime
from pathlib import Path

from django.conf import settings
from django.db import router
from django.template.loader import render_to_string
from django.utils import timezone
from pyspark.sql import DataFrame, SparkSession

from analytics import selectors, services
from analytics.checks import CheckContext
from analytics.jdbc import jdbc_source
from analytics.models import CheckResult, DailyMetrics, NightlyRun, UserDailyCredits, Violation
from analytics.period import Period
from analytics.results import DayResult, analytics_document, consistency_document
from analytics.selectors import report_dir

# Rows per JDBC batch when Spark fills the staging table.
JDBC_WRITE_BATCH = 10_000
PARQUET_DIR = "parquet"


def parquet_root() -> str:
    """The URL the Parquet datasets live under: ANALYTICS_PARQUET_URL, or REPORTS_DIR/parquet on local disk."""
    return settings.ANALYTICS_PARQUET_URL.rstrip("/") or (Path(settings.REPORTS_DIR) / PARQUET_DIR).resolve().as_uri()


def write_parquet(spark: SparkSession, *, period: Period, datasets: dict[str, tuple[DataFrame, set[date]]]) -> str:
    """Write each dataset partitioned by date, replacing the period's partitions; return the root URL.

    Dynamic overwrite replaces the partitions the frame has rows for. A day that now has no rows (a day whose
    violations were repaired) has no partition in the frame, so its old partition is deleted explicitly.
    """
    root = parquet_root()
    for name, (df, days_with_rows) in datasets.items():
        url = f"{root}/{name}"
        (
            df.repartition("date")
            .write.mode("overwrite")
            .option("partitionOverwriteMode", "dynamic")
            .partitionBy("date")
            .parquet(url)
        )
        for day in period.dates:
            if day not in days_with_rows:
                _delete(spark, f"{url}/date={day.isoformat()}")
    return root


def write_mysql(*, run: NightlyRun, period: Period, user_daily: DataFrame, days: list[DayResult]) -> int:
    """Replace the period's rows in the report tables; return how many per-user-per-day rows were written.

    Spark bulk-writes the per-user rows into a staging table; then, day by day, the swap into the real table, the
    daily metrics, the check results and the violations of that day commit together.
    """
    # The report tables' own database (a primary: the job may read from replicas, it never writes to them).
    target = jdbc_source(router.db_for_write(UserDailyCredits))
    stage = services.stage_table_create(run=run)
    try:
        # Each writer gets whole days in key order, so the staging table's (date, user_id) index grows at a few
        # points instead of at random.
        partitions = int(user_daily.sparkSession.conf.get("spark.sql.shuffle.partitions"))
        (
            user_daily.repartition(partitions, "date")
            .sortWithinPartitions("date", "user_id")
            .write.format("jdbc")
            .options(**target.options())
            .option("dbtable", stage)
            .option("batchsize", str(JDBC_WRITE_BATCH))
            .mode("append")
            .save()
        )
        services.report_tables_replace(
            run=run,
            period=period,
            stage_table=stage,
            metrics=[_daily_metrics(day, run) for day in days],
            check_results=[
                CheckResult(run=run, date=day.date, name=name, count=o.count, sample=o.sample, note=o.note[:255])
                for day in days
                for name, o in day.checks.items()
            ],
            violations=[
                Violation(run=run, date=day.date, check_name=name, entity_id=entity, detail=json.loads(detail))
                for day in days
                for name, o in day.checks.items()
                for entity, detail in o.rows
            ],
        )
        return selectors.user_daily_count(period=period)
    finally:
        services.stage_table_drop(name=stage)


def render_day_files(day: DayResult, *, run: NightlyRun, ctx: CheckContext) -> dict[str, str]:
    """Return the text of a day's analytics.json, consistency.json and report.html (nothing is written yet)."""
    generated_at = timezone.now()
    return {
        "analytics.json": _dumps(
            analytics_document(day, run_id=run.pk, parquet_root=parquet_root(), generated_at=generated_at)
        ),
        "consistency.json": _dumps(consistency_document(day, run_id=run.pk, ctx=ctx, generated_at=generated_at)),
        "report.html": html_report(day, run=run, ctx=ctx, generated_at=generated_at),
    }


def write_day_files(day: DayResult, files: dict[str, str]) -> Path:
    """Write a day's rendered files into $REPORTS_DIR/<date>/, each atomically, and link its Parquet partitions."""
    directory = report_dir(day.date)
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        _write_atomic(directory / name, text)
    _link_partitions(directory, day.date)
    return directory


def html_report(day: DayResult, *, run: NightlyRun, ctx: CheckContext, generated_at: datetime) -> str:
    """The day's report as one self-contained HTML page with its charts inline."""
    # Imported here: matplotlib takes a second to import, and this runs on the reports thread, beside Spark.
    from analytics import charts

    counts = {name: outcome.count for name, outcome in day.checks.items()}
    return render_to_string(
        "analytics/report.html",
        {
            "date": day.date.isoformat(),
            "ok": day.ok,
            "violations": day.violations,
            "run_id": run.pk,
            "generated_at": f"{generated_at:%Y-%m-%d %H:%M:%S} UTC",
            "as_of": f"{ctx.as_of:%Y-%m-%d %H:%M:%S} UTC",
            "grace_seconds": ctx.grace_seconds,
            "metrics": day.metrics,
            "distribution": day.distribution,
            "latency": day.latency,
            "top_users": day.top_users,
            "checks": [
                {"name": name, "count": o.count, "sample": o.sample, "note": o.note} for name, o in day.checks.items()
            ],
            "repair": day.repair.as_dict() if day.repair is not None else None,
            "charts": {
                "trend": charts.trend_chart(day.trend),
                "distribution": charts.distribution_chart(day.credit_histogram, day.distribution),
                "top_users": charts.top_users_chart(day.top_users),
                "latency": charts.latency_chart(day.latency_histogram, day.latency),
                # A chart of zeros says less than the sentence the report shows instead.
                "violations": charts.violations_chart(counts) if day.violations else None,
            },
        },
    )


def _daily_metrics(day: DayResult, run: NightlyRun) -> DailyMetrics:
    d, lat = day.distribution, day.latency
    return DailyMetrics(
        date=day.date,
        run=run,
        **day.metrics,
        credits_per_user_p50=d.get("p50"),
        credits_per_user_p90=d.get("p90"),
        credits_per_user_p99=d.get("p99"),
        credits_per_user_max=d.get("max"),
        credits_per_user_mean=d.get("mean"),
        latency_count=lat.get("count") or 0,
        latency_p50_seconds=lat.get("p50"),
        latency_p95_seconds=lat.get("p95"),
        latency_p99_seconds=lat.get("p99"),
        latency_max_seconds=lat.get("max"),
        histogram=day.credit_histogram,
        top_users=day.top_users,
        computed_at=timezone.now(),
    )


def _link_partitions(directory: Path, day: date) -> None:
    """Point <day>/parquet/<dataset> at that day's partition, when the datasets are on local disk."""
    local_root = (Path(settings.REPORTS_DIR) / PARQUET_DIR).resolve()
    if parquet_root() != local_root.as_uri():
        return
    links = directory / PARQUET_DIR
    links.mkdir(exist_ok=True)
    for dataset in sorted(p.name for p in local_root.iterdir() if p.is_dir()):
        link = links / dataset
        target = Path("..") / ".." / PARQUET_DIR / dataset / f"date={day.isoformat()}"
        if link.is_symlink() or link.exists():
            link.unlink()
        if (links / target).exists():
            link.symlink_to(target, target_is_directory=True)


def _delete(spark: SparkSession, url: str) -> None:
    """Delete a path through Hadoop's FileSystem, so hdfs:// and s3a:// roots work like local ones."""
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(url)
    path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).delete(path, True)


def _write_atomic(path: Path, text: str) -> None:
    """Write a file so readers see the old content or the new, never half of it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _json_default(value):
    if isinstance(value, date | datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _dumps(document: dict) -> str:
    return json.dumps(document, indent=2, default=_json_default, ensure_ascii=False) + "\n"
