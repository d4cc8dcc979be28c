"""Consistency checks: pure functions returning the violating rows, one per contract name.

Each check looks at the rows *of the reported days*: orders placed, outbox rows written, credits awarded or dead
letters for orders placed on those days. Every result has `date` (the day the row belongs to), `id` (what an
operator acts on, named in ID_KINDS) and a few columns saying what is wrong. Checks about things that take time
(a credit, a publish) only count rows older than the grace period, so messages still in flight are not reported.
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from analytics.period import Period
from analytics.transforms import day_of, in_period

PUBLISHED = "published"
DISCARDED = "discarded"
OPEN = "open"

# The id each check reports: "order", "credit" and "dead_letter" ids are integers, "transaction" ids are text.
ID_KINDS = {
    "order_without_log": "order",
    "log_without_order": "transaction",
    "missing_credit": "order",
    "credit_amount_mismatch": "credit",
    "credit_ordered_at_mismatch": "credit",
    "orphan_credit": "credit",
    "duplicate_credit": "order",
    "stuck_outbox": "transaction",
    "dead_letters_open": "dead_letter",
}
CHECK_NAMES = tuple(ID_KINDS)


@dataclass(frozen=True)
class CheckContext:
    period: Period
    # The instant the checks judge against, and how old a row must be before its missing effect is a violation.
    as_of: datetime
    grace_seconds: int
    # Published outbox rows are deleted after this many days (OUTBOX_RETENTION_DAYS), so an older order's
    # missing row proves nothing; None when rows are kept for ever.
    log_retention_days: int | None = None

    @property
    def cutoff(self) -> datetime:
        return self.as_of - timedelta(seconds=self.grace_seconds)

    @property
    def logs_kept_since(self) -> datetime | None:
        if self.log_retention_days is None:
            return None
        return self.as_of - timedelta(days=self.log_retention_days)


def _with_retained_logs(orders: DataFrame, ctx: CheckContext) -> DataFrame:
    """Keep the orders whose outbox row cannot have been retired yet."""
    if ctx.logs_kept_since is None:
        return orders
    return orders.where(F.col("created_at") >= F.lit(ctx.logs_kept_since))


def check_order_without_log(orders: DataFrame, logs: DataFrame, ctx: CheckContext) -> DataFrame:
    """Orders placed in the period with no transaction_log row: the message that leads to the credit is gone.

    Orders older than the outbox retention are not judged: their published row may have been deleted on purpose.
    """
    placed = _with_retained_logs(in_period(orders, ctx.period), ctx)
    return placed.join(logs.select(F.col("order_id").alias("id")), "id", "left_anti").select(
        day_of(), "id", "user_id", "total", "created_at"
    )


def check_log_without_order(logs: DataFrame, orders: DataFrame, ctx: CheckContext) -> DataFrame:
    """Outbox rows written in the period whose order does not exist: a message that would credit nothing real."""
    written = in_period(logs, ctx.period)
    return written.join(orders.select(F.col("id").alias("order_id")), "order_id", "left_anti").select(
        day_of(), "id", "order_id", "status", "created_at"
    )


def check_missing_credit(orders: DataFrame, credits: DataFrame, ctx: CheckContext) -> DataFrame:
    """Orders placed in the period, older than the grace period, that have no credit."""
    due = in_period(orders, ctx.period).where(F.col("created_at") < F.lit(ctx.cutoff))
    return due.join(credits.select(F.col("order_id").alias("id")), "id", "left_anti").select(
        day_of(), "id", "user_id", "total", "created_at"
    )


def check_credit_amount_mismatch(credits: DataFrame, orders: DataFrame, ctx: CheckContext) -> DataFrame:
    """Credits awarded in the period whose amount is not 2 x their order's total."""
    awarded = in_period(credits, ctx.period).alias("c")
    return (
        awarded.join(orders.alias("o"), F.col("c.order_id") == F.col("o.id"))
        .where(F.col("c.total") != F.col("o.total") * 2)
        .select(
            F.to_date(F.col("c.created_at")).alias("date"),
            F.col("c.id").alias("id"),
            F.col("c.order_id").alias("order_id"),
            (F.col("o.total") * 2).alias("expected"),
            F.col("c.total").alias("actual"),
        )
    )


def check_credit_ordered_at_mismatch(credits: DataFrame, orders: DataFrame, ctx: CheckContext) -> DataFrame:
    """Credits awarded in the period dated by their message (version 2 on) at another time than their order was placed.

    The message's ordered_at must mean the order's created_at (core/contract.py); a producer that sent anything else
    changed what a field means, which the versioning rule forbids. Credits from version-1 messages carry no date.
    """
    awarded = in_period(credits, ctx.period).where(F.col("ordered_at").isNotNull()).alias("c")
    return (
        awarded.join(orders.alias("o"), F.col("c.order_id") == F.col("o.id"))
        .where(F.col("c.ordered_at") != F.col("o.created_at"))
        .select(
            F.to_date(F.col("c.created_at")).alias("date"),
            F.col("c.id").alias("id"),
            F.col("c.order_id").alias("order_id"),
            F.col("o.created_at").alias("expected"),
            F.col("c.ordered_at").alias("actual"),
        )
    )


def check_orphan_credit(credits: DataFrame, orders: DataFrame, ctx: CheckContext) -> DataFrame:
    """Credits awarded in the period whose order does not exist."""
    awarded = in_period(credits, ctx.period)
    return awarded.join(orders.select(F.col("id").alias("order_id")), "order_id", "left_anti").select(
        day_of(), "id", "order_id", "user_id", "total"
    )


def check_duplicate_credit(credits: DataFrame, ctx: CheckContext) -> DataFrame:
    """Orders credited more than once, reported on the day of their latest credit if that is in the period.

    order_credits.order_id is UNIQUE in this schema, so this guards deployments (or copies) without the index.
    """
    # Count first (a cheap hash aggregation), and gather credit ids only for the rare orders that need them.
    duplicated = (
        credits.groupBy("order_id")
        .agg(F.count("*").alias("credits"), F.max("created_at").alias("latest"))
        .where(F.col("credits") > 1)
        .where((F.col("latest") >= F.lit(ctx.period.start)) & (F.col("latest") < F.lit(ctx.period.end)))
    )
    credit_ids = (
        credits.join(duplicated.select("order_id"), "order_id")
        .groupBy("order_id")
        .agg(F.sort_array(F.collect_list("id")).alias("credit_ids"))
    )
    return duplicated.join(credit_ids, "order_id").select(
        day_of("latest"), F.col("order_id").alias("id"), "credits", "credit_ids"
    )


def check_stuck_outbox(logs: DataFrame, ctx: CheckContext) -> DataFrame:
    """Outbox rows written in the period, older than the grace period, still not published (pending or dead).

    Discarded rows are not stuck: a person decided they must not be sent.
    """
    return (
        in_period(logs, ctx.period)
        .where(F.col("created_at") < F.lit(ctx.cutoff))
        .where(~F.col("status").isin(PUBLISHED, DISCARDED))
        .select(day_of(), "id", "order_id", "status", "attempts", "created_at")
    )


def check_dead_letters_open(dead_letters: DataFrame, orders: DataFrame, ctx: CheckContext) -> DataFrame:
    """Open dead-lettered credit messages for orders placed in the period: each needs a person's decision."""
    placed = in_period(orders, ctx.period).select(F.col("id").alias("order_id"), day_of())
    return (
        dead_letters.where(F.col("status") == OPEN)
        .join(placed, "order_id")
        .select("date", "id", "order_id", F.col("created_at").alias("failed_at"))
    )


def run_checks(
    *, orders: DataFrame, logs: DataFrame, credits: DataFrame, dead_letters: DataFrame, ctx: CheckContext
) -> dict[str, DataFrame]:
    """Run every check; the keys are docs/CONTRACT.md's names, in its order."""
    checks: dict[str, Callable[[], DataFrame]] = {
        "order_without_log": lambda: check_order_without_log(orders, logs, ctx),
        "log_without_order": lambda: check_log_without_order(logs, orders, ctx),
        "missing_credit": lambda: check_missing_credit(orders, credits, ctx),
        "credit_amount_mismatch": lambda: check_credit_amount_mismatch(credits, orders, ctx),
        "credit_ordered_at_mismatch": lambda: check_credit_ordered_at_mismatch(credits, orders, ctx),
        "orphan_credit": lambda: check_orphan_credit(credits, orders, ctx),
        "duplicate_credit": lambda: check_duplicate_credit(credits, ctx),
        "stuck_outbox": lambda: check_stuck_outbox(logs, ctx),
        "dead_letters_open": lambda: check_dead_letters_open(dead_letters, orders, ctx),
    }
    return {name: checks[name]() for name in CHECK_NAMES}


def transform_violations(results: dict[str, DataFrame], *, keep: int) -> DataFrame:
    """All violations in one frame: check, date, entity_id (text), detail (JSON), count for the check and day.

    Only the first `keep` rows per check and day (by id) are returned; `count` is always the full count.
    """
    frames = []
    for name, df in results.items():
        details = [c for c in df.columns if c not in ("date", "id")]
        numeric = ID_KINDS[name] != "transaction"
        frames.append(
            df.select(
                F.lit(name).alias("check"),
                "date",
                F.col("id").cast("string").alias("entity_id"),
                (F.col("id") if numeric else F.lit(None)).cast("long").alias("id_number"),
                F.to_json(F.struct(*details)).alias("detail"),
            )
        )
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    per_check_day = Window.partitionBy("check", "date")
    ordered = per_check_day.orderBy(F.col("id_number").asc_nulls_last(), F.col("entity_id").asc())
    return (
        union.withColumn("count", F.count("*").over(per_check_day))
        .withColumn("rank", F.row_number().over(ordered))
        .where(F.col("rank") <= keep)
        .drop("id_number")
    )


# The checks whose answers depend on rows outside the read window: what they report is what the look-ups look for.
LOOKUP_CHECKS = ("order_without_log", "log_without_order", "missing_credit", "orphan_credit")


def lookup_candidates(results: dict[str, DataFrame]) -> DataFrame:
    """Ids the checks need from outside the read window, as distinct (kind, id) with kind order, credit or log.

    `results` holds the LOOKUP_CHECKS run on the window's rows. order: orders referenced by the period's credits or
    outbox rows but not read (orphan_credit, log_without_order); credit and log: orders of the period with no credit
    (missing_credit) or no outbox row (order_without_log) among the rows read, whose credit or row may simply have
    been written outside the window (a repair a week later). Looking these up keeps the answers exact; when nothing
    is found, these results are the checks' answers.
    """
    referenced = (
        results["orphan_credit"]
        .select("order_id")
        .unionByName(results["log_without_order"].select("order_id"))
        .where(F.col("order_id").isNotNull())
        .select(F.lit("order").alias("kind"), F.col("order_id").alias("id"))
    )
    uncredited = results["missing_credit"].select(F.lit("credit").alias("kind"), "id")
    unlogged = results["order_without_log"].select(F.lit("log").alias("kind"), "id")
    return referenced.unionByName(uncredited).unionByName(unlogged).distinct()
