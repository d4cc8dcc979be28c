"""The nightly job: extract, transform, check, load, and optionally repair, for one day or several.

This module wires the stages together and collects the small per-day results the reports are made of; the
Spark work itself is in extract (I/O), transforms and checks (pure), and load (I/O).
"""

import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import date, timedelta
from operator import itemgetter

from django.conf import settings
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from analytics import extract, load, services
from analytics.checks import CHECK_NAMES, ID_KINDS, CheckContext, lookup_candidates, run_checks, transform_violations
from analytics.models import NightlyRun
from analytics.period import Period
from analytics.repair import RepairResult, repair
from analytics.spark import spark_session, tuning_for
from analytics.transforms import (
    transform_award_latency,
    transform_credit_distribution,
    transform_credit_histogram,
    transform_daily_metrics,
    transform_latency_histogram,
    transform_latency_summary,
    transform_top_users,
    transform_trend,
    transform_user_daily,
)

SAMPLE_SIZE = 20
METRIC_COLUMNS = (
    "orders",
    "order_units",
    "users",
    "new_users",
    "credited_users",
    "credits_awarded",
    "credits_total",
)


@dataclass
class CheckOutcome:
    count: int = 0
    sample: list = field(default_factory=list)
    # (entity id, detail JSON) of the stored violations, at most ANALYTICS_MAX_STORED_VIOLATIONS.
    rows: list[tuple[str, str]] = field(default_factory=list)
    note: str = ""


@dataclass
class DayResult:
    """Everything the reports say about one day."""

    date: date
    metrics: dict
    distribution: dict
    latency: dict
    credit_histogram: list[dict]
    latency_histogram: list[dict]
    top_users: list[dict]
    trend: list[dict]
    checks: dict[str, CheckOutcome]
    repair: RepairResult | None = None

    @property
    def violations(self) -> int:
        return sum(outcome.count for outcome in self.checks.values())

    @property
    def ok(self) -> bool:
        return self.violations == 0


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
        services.run_stage(run=self.run, stage=name)
        started = time.monotonic()
        self.write(f"[{self.index}/{self.stages}] {name} ...")
        facts: dict = {}
        yield facts
        detail = ", ".join(f"{k}={v:,}" if isinstance(v, int) else f"{k}={v}" for k, v in facts.items())
        self.write(f"[{self.index}/{self.stages}] {name} done in {time.monotonic() - started:.1f}s {detail}".rstrip())


def run_nightly(
    *, run: NightlyRun, period: Period, repair_requested: bool, write: Callable[[str], None], verbose: bool = False
) -> list[DayResult]:
    """Run the job for the period under an already started `run`; return the per-day results."""
    progress = Progress(run=run, write=write, stages=6 + int(repair_requested))
    ctx = CheckContext(
        period=period,
        as_of=run.as_of,
        grace_seconds=settings.CONSISTENCY_GRACE_SECONDS,
        log_retention_days=getattr(settings, "OUTBOX_RETENTION_DAYS", None),
    )
    sources = extract.sources()
    lookback = timedelta(hours=settings.ANALYTICS_LOOKBACK_HOURS)
    with ExitStack() as stack:
        with progress.stage("spark session") as facts:
            rows = extract.count_orders(sources.orders, start=period.start - lookback, end=period.end + lookback)
            spark = stack.enter_context(spark_session(tuning=tuning_for(rows), verbose=verbose))
            facts["master"] = spark.sparkContext.master
            facts["shuffle_partitions"] = spark.conf.get("spark.sql.shuffle.partitions")
        try:
            days = _run_in_session(
                spark, run=run, period=period, ctx=ctx, sources=sources, progress=progress, lookback=lookback
            )
        finally:
            # A shared session (tests, a notebook) must not keep this run's cached frames.
            spark.catalog.clearCache()
    if repair_requested:
        with progress.stage("repair") as facts:
            for day in days:
                day.repair = repair(
                    missing_credit_order_ids=[int(entity) for entity, _ in day.checks["missing_credit"].rows],
                    stuck_log_ids=[entity for entity, _ in day.checks["stuck_outbox"].rows],
                )
                load.write_day_files(day, load.render_day_files(day, run=run, ctx=ctx))
            facts["reenqueued"] = sum(day.repair.reenqueued for day in days)
    return days


def _run_in_session(
    spark: SparkSession,
    *,
    run: NightlyRun,
    period: Period,
    ctx: CheckContext,
    sources: extract.Sources,
    progress: Progress,
    lookback: timedelta,
) -> list[DayResult]:
    with progress.stage("extract") as facts:
        data = extract.extract_window(spark, sources, start=period.start - lookback, end=period.end + lookback)
        data.orders, data.logs, data.credits = (
            _by_order(data.orders, "id"),
            _by_order(data.logs, "order_id"),
            _by_order(data.credits, "order_id"),
        )
        facts.update(_count_together(orders=data.orders, logs=data.logs, credits=data.credits))

    with progress.stage("look-ups outside the window") as facts:
        wanted = defaultdict(list)
        for row in lookup_candidates(orders=data.orders, logs=data.logs, credits=data.credits, ctx=ctx).collect():
            wanted[row.kind].append(row.id)
        if wanted["order"]:
            found = extract.read_orders_by_id(spark, sources, wanted["order"])
            data.orders = _by_order(data.orders.unionByName(found), "id")
        if wanted["credit"]:
            found = extract.read_credits_by_order_id(spark, sources, wanted["credit"])
            data.credits = _by_order(data.credits.unionByName(found), "order_id")
        if wanted["log"]:
            found = extract.read_logs_by_order_id(spark, sources, wanted["log"])
            data.logs = _by_order(data.logs.unionByName(found), "order_id")
        facts.update({f"{kind}_ids": len(wanted[kind]) for kind in ("order", "credit", "log")})

    with progress.stage("credit analytics and consistency checks") as facts:
        user_daily = transform_user_daily(data.orders, data.credits, period).cache()
        daily = transform_daily_metrics(user_daily, data.orders, data.first_orders, period).cache()
        latency = transform_award_latency(data.credits, data.orders, period)
        summary = (
            daily.join(_prefixed(transform_credit_distribution(user_daily), "cpu_"), "date", "left")
            .join(_prefixed(transform_latency_summary(latency), "latency_"), "date", "left")
            .cache()
        )
        results = run_checks(
            orders=data.orders, logs=data.logs, credits=data.credits, dead_letters=data.dead_letters, ctx=ctx
        )
        violations = transform_violations(results, keep=settings.ANALYTICS_MAX_STORED_VIOLATIONS).cache()
        collected = collect_together(
            summary=summary,
            credit_histogram=transform_credit_histogram(user_daily),
            latency_histogram=transform_latency_histogram(latency),
            top_users=transform_top_users(user_daily),
            trend=transform_trend(data.history, daily, period),
            violations=violations,
        )
        analytics = _assemble_analytics(collected)
        outcomes = _assemble_outcomes(collected["violations"], period, ctx=ctx, note=data.dead_letters_note)
        facts["orders"] = sum(row["orders"] for row in collected["summary"])
        facts["credits"] = sum(row["credits_awarded"] for row in collected["summary"])
        facts.update({name: sum(outcomes[d][name].count for d in period.dates) for name in CHECK_NAMES})

    days = [DayResult(date=day, checks=outcomes[day], **analytics.get(day, _empty_analytics())) for day in period.dates]

    # Drawing the charts is Python work and the loads are JVM and MariaDB work: render the reports on a thread
    # meanwhile (a month of reports is 150 charts), and write them only once the tables are committed. The Parquet
    # and MySQL writes run side by side too: one keeps the JVM busy while the other waits on MariaDB.
    with (
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="reports") as renderer,
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="parquet") as writer,
    ):
        rendering = [renderer.submit(load.render_day_files, day, run=run, ctx=ctx) for day in days]
        with progress.stage("load: parquet and mysql") as facts:
            active = {d.date for d in days if d.metrics["orders"] or d.metrics["credits_awarded"]}
            parquet = writer.submit(
                load.write_parquet,
                spark,
                period=period,
                datasets={
                    "user_daily_credits": (user_daily, active),
                    "daily_metrics": (summary, set(period.dates)),
                    "violations": (violations.drop("rank"), {d.date for d in days if d.violations}),
                },
            )
            facts["user_day_rows"] = load.write_mysql(
                run=run, period=period, source=sources.orders, user_daily=user_daily, days=days
            )
            facts["parquet"] = parquet.result()
        with progress.stage("load: reports") as facts:
            for day, files in zip(days, rendering, strict=True):
                load.write_day_files(day, files.result())
            facts["dir"] = str(settings.REPORTS_DIR)
    return days


def _by_order(df: DataFrame, column: str) -> DataFrame:
    """Hash-partition a frame on its order id and cache it.

    Nearly every check and transform joins orders, outbox rows and credits on the order id; with all three cached
    in the same partitioning and order, those joins need no further shuffle or sort (a month of rows is shuffled
    and sorted once, not ten times).
    """
    partitions = int(df.sparkSession.conf.get("spark.sql.shuffle.partitions"))
    return df.repartition(partitions, column).sortWithinPartitions(column).cache()


def _prefixed(df: DataFrame, prefix: str) -> DataFrame:
    return df.select("date", *[F.col(c).alias(prefix + c) for c in df.columns if c != "date"])


def collect_together(**frames: DataFrame) -> dict[str, list[dict]]:
    """Collect several small frames in one Spark job, as lists of dicts keyed by the frame's name.

    Each frame travels as JSON text in one union, so the stages of all of them are planned and scheduled once,
    and independent stages run side by side; on a small machine that saves seconds per frame.
    """
    union = None
    for name, df in frames.items():
        rows = df.select(
            F.lit(name).alias("frame"),
            F.to_json(F.struct(*df.columns), {"ignoreNullFields": "false"}).alias("row"),
        )
        union = rows if union is None else union.unionByName(rows)
    collected: dict[str, list[dict]] = {name: [] for name in frames}
    for row in union.collect():
        collected[row.frame].append(json.loads(row.row))
    return collected


def _count_together(**frames: DataFrame) -> dict[str, int]:
    """Count (and so fill the cache of) several frames in one Spark job."""
    union = None
    for name, df in frames.items():
        tagged = df.select(F.lit(name).alias("frame"))
        union = tagged if union is None else union.unionByName(tagged)
    counts = dict.fromkeys(frames, 0)
    for row in union.groupBy("frame").count().collect():
        counts[row.frame] = row["count"]
    return counts


def _assemble_analytics(collected: dict[str, list[dict]]) -> dict[date, dict]:
    """Arrange the collected analytics per day, as plain dicts ready for JSON and templates."""
    by_day: dict[date, dict] = {}
    for values in collected["summary"]:
        by_day[date.fromisoformat(values["date"])] = {
            "metrics": {k: values[k] for k in METRIC_COLUMNS},
            "distribution": {k: values[f"cpu_{k}"] for k in ("p50", "p90", "p99", "max", "mean")}
            | {"users": values["cpu_users"] or 0},
            "latency": {k: values[f"latency_{k}"] for k in ("p50", "p95", "p99", "max")}
            | {"count": values["latency_credits"] or 0},
            "credit_histogram": [],
            "latency_histogram": [],
            "top_users": [],
            "trend": [],
        }
    for row in sorted(collected["credit_histogram"], key=itemgetter("date", "bucket")):
        by_day[date.fromisoformat(row["date"])]["credit_histogram"].append(
            {"lower": row["lower"], "upper": row["upper"], "users": row["users"]}
        )
    for row in sorted(collected["latency_histogram"], key=itemgetter("date", "bucket")):
        by_day[date.fromisoformat(row["date"])]["latency_histogram"].append(
            {"lower": row["lower"], "upper": row["upper"], "credits": row["credits"]}
        )
    for row in sorted(collected["top_users"], key=itemgetter("date", "rank")):
        by_day[date.fromisoformat(row.pop("date"))]["top_users"].append(row)
    for row in sorted(collected["trend"], key=itemgetter("report_date", "date")):
        by_day[date.fromisoformat(row["report_date"])]["trend"].append(
            {"date": row["date"], **{k: row[k] for k in METRIC_COLUMNS}}
        )
    return by_day


def _empty_analytics() -> dict:
    return {
        "metrics": dict.fromkeys(METRIC_COLUMNS, 0),
        "distribution": {"users": 0},
        "latency": {"count": 0},
        "credit_histogram": [],
        "latency_histogram": [],
        "top_users": [],
        "trend": [],
    }


def _assemble_outcomes(
    violations: list[dict], period: Period, *, ctx: CheckContext, note: str
) -> dict[date, dict[str, CheckOutcome]]:
    """Arrange the collected violations per day and check: full count, sample ids, stored rows."""
    outcomes = {day: {name: CheckOutcome() for name in CHECK_NAMES} for day in period.dates}
    for row in sorted(violations, key=itemgetter("check", "date", "rank")):
        outcome = outcomes[date.fromisoformat(row["date"])][row["check"]]
        outcome.count = row["count"]
        outcome.rows.append((row["entity_id"], row["detail"]))
        if len(outcome.sample) < SAMPLE_SIZE:
            numeric = ID_KINDS[row["check"]] != "transaction"
            outcome.sample.append(int(row["entity_id"]) if numeric else row["entity_id"])
    for day, checks in outcomes.items():
        if note:
            checks["dead_letters_open"].note = note
        if ctx.logs_kept_since is not None and Period.ending(day).start < ctx.logs_kept_since:
            checks["order_without_log"].note = (
                f"orders placed before {ctx.logs_kept_since:%Y-%m-%d %H:%M} UTC not judged: published outbox rows "
                f"are deleted after OUTBOX_RETENTION_DAYS={ctx.log_retention_days}"
            )
    return outcomes
