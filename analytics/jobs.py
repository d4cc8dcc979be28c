"""The nightly job: extract, transform, check, load, and optionally repair, for one day or several.

This module wires the stages together and collects the small per-day results the reports are made of; the
Spark work itself is in extract (I/O), transforms and checks (pure), and load (I/O); the collected rows become
DayResults in results (pure); the run's lock, history row and progress are runs'. The stages a warm-up also runs
(analytics/warm_up.py) are public: `partition_by_order`, `analyse`, `collect_together`; so is `window_bounds`, which
bench/analytics_floor.py reads by as the job does.
"""

import json
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Protocol

from django.conf import settings
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from analytics import differences, extract, jdbc, load
from analytics.checks import CHECK_NAMES, CheckContext, run_checks, transform_violations
from analytics.lookups import by_order, look_up_missing
from analytics.models import NightlyRun
from analytics.period import Period
from analytics.repair import repair
from analytics.results import DayResult, day_results
from analytics.segments import Aggregates
from analytics.spark import spark_session, tuning_for
from analytics.transforms import (
    transform_award_latency,
    transform_credit_distribution,
    transform_credit_histogram,
    transform_daily_metrics,
    transform_daily_metrics_counted,
    transform_latency_histogram,
    transform_latency_summary,
    transform_top_users,
    transform_trend,
    transform_user_daily,
    transform_user_daily_counted,
)


class Progress(Protocol):
    """What the job reports its stages through (analytics/runs.py records them on the run)."""

    def stage(self, name: str) -> AbstractContextManager[dict]: ...


@dataclass
class Analysis:
    """The analytics and checks of a period: the frames the loads write, and the rows collected for the reports."""

    user_daily: DataFrame
    summary: DataFrame
    violations: DataFrame
    collected: dict[str, list[dict]]


# The stages run_stages reports through its progress, without and with --repair.
STAGES = 8


def stage_count(*, repair_requested: bool) -> int:
    """Return how many stages a run has."""
    return STAGES + int(repair_requested)


def run_stages(
    *, run: NightlyRun, period: Period, repair_requested: bool, progress: Progress, verbose: bool = False
) -> list[DayResult]:
    """Run the job's stages for the period under an already started `run`; return the per-day results.

    The run's lock and history row are the caller's (analytics/runs.py); each stage reports through `progress`.
    """
    ctx = CheckContext(
        period=period,
        as_of=run.as_of,
        grace_seconds=settings.CONSISTENCY_GRACE_SECONDS,
        log_retention_days=getattr(settings, "OUTBOX_RETENTION_DAYS", None),
    )
    sources = jdbc.sources()
    with ExitStack() as stack:
        with progress.stage("spark session") as facts:
            # The period's own spans: the comparisons cover its orders' ids, and what they miss is fetched by time.
            plan = extract.plan_window(sources, start=period.start, end=period.end)
            spark = stack.enter_context(spark_session(tuning=tuning_for(plan.orders.rows), verbose=verbose))
            facts["master"] = spark.sparkContext.master
            facts["shuffle_partitions"] = spark.conf.get("spark.sql.shuffle.partitions")
        try:
            return _run_in_session(
                spark,
                run=run,
                ctx=ctx,
                sources=sources,
                plan=plan,
                progress=progress,
                repair_requested=repair_requested,
            )
        finally:
            # A shared session (tests, a notebook) must not keep this run's cached frames.
            spark.catalog.clearCache()


def window_bounds(period: Period) -> dict[str, datetime]:
    """Return the instants the job reads between: the period and ANALYTICS_LOOKBACK_HOURS on each side, so credits
    awarded after midnight meet their orders.
    """
    lookback = timedelta(hours=settings.ANALYTICS_LOOKBACK_HOURS)
    return {"start": period.start - lookback, "end": period.end + lookback}


def _run_in_session(
    spark: SparkSession,
    *,
    run: NightlyRun,
    ctx: CheckContext,
    sources: jdbc.Sources,
    plan: extract.WindowPlan,
    progress: Progress,
    repair_requested: bool,
) -> list[DayResult]:
    period = ctx.period
    # Only what disagrees is read; its rows are shuffled by order id and cached (analytics/differences.py).
    found = differences.extract_differences(spark, sources, plan, ctx=ctx, progress=progress)
    data = found.data

    with progress.stage("look-ups outside the window") as facts:
        looked_up = look_up_missing(spark, data, ctx=ctx, sources=sources)
        data = looked_up.data
        facts.update(looked_up.facts)

    with progress.stage("credit analytics and consistency checks") as facts:
        analysis = analyse(
            data,
            ctx=ctx,
            keep=settings.ANALYTICS_MAX_STORED_VIOLATIONS,
            checked=looked_up.checked,
            aggregates=found.aggregates,
        )
        days = day_results(analysis.collected, ctx=ctx)
        facts["orders"] = sum(day.metrics["orders"] for day in days)
        facts["credits"] = sum(day.metrics["credits_awarded"] for day in days)
        facts.update({name: sum(day.checks[name].count for day in days) for name in CHECK_NAMES})

    # Drawing the charts is Python work and the loads are JVM and MariaDB work: render the reports on a thread
    # meanwhile (a month of reports is 150 charts), and write them only once the tables are committed. A repair
    # is part of what the reports say, so with --repair they are rendered after it instead, still once. The
    # Parquet and MySQL writes run side by side too: one keeps the JVM busy while the other waits on MariaDB.
    with (
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="reports") as renderer,
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="parquet") as writer,
    ):

        def render() -> list:
            return [renderer.submit(load.render_day_files, day, run=run, ctx=ctx) for day in days]

        rendering = [] if repair_requested else render()
        with progress.stage("load: parquet and mysql") as facts:
            active = {d.date for d in days if d.metrics["orders"] or d.metrics["credits_awarded"]}
            parquet = writer.submit(
                load.write_parquet,
                spark,
                period=period,
                datasets={
                    "user_daily_credits": (analysis.user_daily, active),
                    "daily_metrics": (analysis.summary, set(period.dates)),
                    "violations": (analysis.violations.drop("rank"), {d.date for d in days if d.violations}),
                },
            )
            facts["user_day_rows"] = load.write_mysql(run=run, period=period, user_daily=analysis.user_daily, days=days)
            facts["parquet"] = parquet.result()
        if repair_requested:
            with progress.stage("repair") as facts:
                for day in days:
                    day.repair = repair(
                        missing_credit_order_ids=[int(entity) for entity, _ in day.checks["missing_credit"].rows],
                        stuck_log_ids=[entity for entity, _ in day.checks["stuck_outbox"].rows],
                    )
                facts["reenqueued"] = sum(day.repair.reenqueued for day in days)
            rendering = render()
        with progress.stage("load: reports") as facts:
            for day, files in zip(days, rendering, strict=True):
                load.write_day_files(day, files.result())
            facts["dir"] = str(settings.REPORTS_DIR)
    return days


def partition_by_order(data: extract.Extracted) -> extract.Extracted:
    """Return the extract with its orders, outbox rows and credits hash-partitioned on the order id and cached."""
    return replace(
        data,
        orders=by_order(data.orders, "id"),
        logs=by_order(data.logs, "order_id"),
        credits=by_order(data.credits, "order_id"),
    )


def analyse(
    data: extract.Extracted,
    *,
    ctx: CheckContext,
    keep: int,
    checked: dict[str, DataFrame] | None = None,
    aggregates: Aggregates | None = None,
) -> Analysis:
    """Compute the period's credit analytics and run its checks (keeping `keep` violations per check and day), and
    collect what the reports need in one Spark job. `checked` holds checks already run on these frames (the
    look-ups'), whose answers are used as they are. The analytics come from `aggregates` the databases computed
    when given (a run's `data` holds only the rows that disagree), else from `data`'s rows (a day's every row).
    """
    period = ctx.period
    if aggregates is None:
        user_daily = transform_user_daily(data.orders, data.credits, period).cache()
        daily = transform_daily_metrics(user_daily, data.orders, data.first_orders, period).cache()
        latency = transform_award_latency(data.credits, data.orders, period)
    else:
        user_daily = transform_user_daily_counted(
            aggregates.orders_per_user, aggregates.credits_per_user_day, period
        ).cache()
        daily = transform_daily_metrics_counted(user_daily, aggregates.new_users, period).cache()
        latency = aggregates.latency
    # Cached (the aggregates' already are): the latency summary and histogram both read it.
    if not latency.is_cached:
        latency = latency.cache()
    summary = (
        daily.join(_prefixed(transform_credit_distribution(user_daily), "cpu_"), "date", "left")
        .join(_prefixed(transform_latency_summary(latency), "latency_"), "date", "left")
        .cache()
    )
    results = run_checks(
        orders=data.orders, logs=data.logs, credits=data.credits, dead_letters=data.dead_letters, ctx=ctx
    ) | (checked or {})
    violations = transform_violations(results, keep=keep).cache()
    collected = collect_together(
        summary=summary,
        credit_histogram=transform_credit_histogram(user_daily),
        latency_histogram=transform_latency_histogram(latency),
        top_users=transform_top_users(user_daily),
        trend=transform_trend(data.history, daily, period),
        violations=violations,
    )
    return Analysis(user_daily=user_daily, summary=summary, violations=violations, collected=collected)


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
