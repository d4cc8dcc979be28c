"""The rows the checks need from outside the read window: which ones, read by key ranges, added to the frames.

The window (the reported days and the look-back) holds nearly every row a check needs. The exceptions are the
orders of credits and outbox rows written long after them, and the credits and outbox rows of the period's orders
that were written long after the window or never. Four checks run on the window's rows name them (ids only), on the
cached, co-partitioned frames without a shuffle of their rows. Only key ranges travel to the driver, at most
MAX_RANGES per kind however many candidates there are (a day whose credits all failed names every order), and the
rows read in those ranges, wherever in time, are kept if their id is a candidate's (a candidate has no row among
the frame's, so nothing is counted twice). A frame is rebuilt only when a look-up found rows for it, which on a
healthy day none does: the candidates are the violations themselves.
"""

from dataclasses import dataclass, replace

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from analytics import extract, jdbc
from analytics.checks import LOOKUP_CHECKS, CheckContext, lookup_candidates, run_checks
from analytics.schemas import CREDITS_SCHEMA, ORDERS_SCHEMA

# Key ranges collected per kind of candidate; more candidates than this are covered by wider ranges (reading rows
# that are then dropped), so the driver holds at most this many pairs whatever the day looks like.
MAX_RANGES = 10_000


@dataclass(frozen=True)
class Kind:
    """One kind of candidate: which frame it completes, from which table, matched on which column."""

    frame: str
    table: extract.Table
    # The table's column holding the candidate id, and the frame's (the order id, as read or as conformed).
    column: str
    frame_column: str


KINDS = {
    "order": Kind("orders", extract.ORDERS, column="id", frame_column="id"),
    "credit": Kind("credits", extract.CREDITS, column="order_id", frame_column="order_id"),
    "log": Kind("logs", extract.LOGS, column="foreign_key", frame_column="order_id"),
}


def by_order(df: DataFrame, column: str) -> DataFrame:
    """Hash-partition a frame on its order id, sort each partition by it, and cache it.

    Nearly every check and transform joins orders, outbox rows and credits on the order id; with all three cached
    in the same partitioning and order, those joins need no further shuffle or sort (a month of rows is shuffled
    and sorted once, not ten times).
    """
    partitions = int(df.sparkSession.conf.get("spark.sql.shuffle.partitions"))
    return df.repartition(partitions, column).sortWithinPartitions(column).cache()


@dataclass
class LookedUp:
    """The frames with any rows found outside the window, and the LOOKUP_CHECKS' answers when they still hold."""

    data: extract.Extracted
    # Cached; empty when rows were found, since the checks must then run again on the extended frames.
    checked: dict[str, DataFrame]
    facts: dict[str, int]


def look_up_missing(
    spark: SparkSession, data: extract.Extracted, *, ctx: CheckContext, sources: jdbc.Sources
) -> LookedUp:
    """Add to the co-partitioned frames the rows outside the window that the checks need.

    The LOOKUP_CHECKS run here on the window's rows, cached, and name the candidates; their first job is the
    first to need the frames' rows, so it also fills the frames' caches. When no candidate's rows are found (a
    healthy day), those answers are final and the analysis reuses them instead of running the four checks again.
    """
    results = run_checks(
        orders=data.orders, logs=data.logs, credits=data.credits, dead_letters=data.dead_letters, ctx=ctx
    )
    checked = {name: results[name].cache() for name in LOOKUP_CHECKS}
    candidates = lookup_candidates(checked).cache()
    ranges = candidate_ranges(candidates)
    source_of = {"orders": sources.orders, "credits": sources.credits, "logs": sources.orders}
    reads = {}
    for name, kind in KINDS.items():
        rows = extract.read_missing(
            spark, source_of[kind.frame], kind.table, column=kind.column, ranges=ranges.get(name, [])
        )
        if rows is not None:
            wanted = candidates.where(F.col("kind") == name).select(F.col("id").alias(kind.frame_column))
            reads[name] = _conformed(kind, rows).join(wanted, kind.frame_column, "left_semi").cache()
    found = dict.fromkeys(KINDS, 0) | count_together(reads)
    additions = {}
    for name, rows in reads.items():
        kind = KINDS[name]
        if found[name]:
            additions[kind.frame] = _with_rows(getattr(data, kind.frame), rows, kind.frame_column)
    if additions:
        # Filled before the frames they extend are dropped from the cache (else they would be read again).
        count_together(additions)
        for frame in additions:
            getattr(data, frame).unpersist()
        for df in checked.values():
            df.unpersist()
        checked = {}
    for rows in reads.values():
        rows.unpersist()
    candidates.unpersist()
    facts = {f"{name}_ranges": len(ranges.get(name, [])) for name in KINDS}
    facts |= {f"{name}_found": count for name, count in found.items()}
    return LookedUp(data=replace(data, **additions), checked=checked, facts=facts)


def candidate_ranges(candidates: DataFrame, max_ranges: int = MAX_RANGES) -> dict[str, list[tuple[int, int]]]:
    """Return, per kind, inclusive id ranges covering every candidate: one per id while a kind has at most
    `max_ranges` distinct candidates, else `max_ranges` equal slices of its ids' span, each narrowed to the ids in it.

    One Spark job brings each kind's first `max_ranges` + 1 ids, which is all of them on nearly every run; only a
    kind with more (a day whose credits all failed) takes two more jobs, for its slices.
    """
    first = (
        candidates.select("kind", "id")
        .distinct()
        .withColumn("rank", F.row_number().over(Window.partitionBy("kind").orderBy("id")))
        .where(F.col("rank") <= max_ranges + 1)
    )
    ids: dict[str, list[int]] = {}
    for row in first.collect():
        ids.setdefault(row.kind, []).append(row.id)
    ranges = {kind: sorted((i, i) for i in found) for kind, found in ids.items() if len(found) <= max_ranges}
    crowded = [kind for kind, found in ids.items() if len(found) > max_ranges]
    if crowded:
        ranges |= _slices(candidates.where(F.col("kind").isin(crowded)), max_ranges)
    return ranges


def _slices(candidates: DataFrame, max_ranges: int) -> dict[str, list[tuple[int, int]]]:
    stats = candidates.groupBy("kind").agg(F.min("id").alias("low"), F.max("id").alias("high"))
    width: Column = F.lit(1)
    for row in stats.collect():
        width = F.when(F.col("kind") == row.kind, F.lit(-(-(row.high - row.low + 1) // max_ranges))).otherwise(width)
    slices = candidates.groupBy("kind", F.floor(F.col("id") / width).alias("slice")).agg(
        F.min("id").alias("low"), F.max("id").alias("high")
    )
    ranges: dict[str, list[tuple[int, int]]] = {}
    for row in slices.collect():
        ranges.setdefault(row.kind, []).append((row.low, row.high))
    return {kind: sorted(pairs) for kind, pairs in ranges.items()}


def _conformed(kind: Kind, rows: DataFrame) -> DataFrame:
    if kind.frame == "logs":
        return extract.conform_logs(rows)
    return extract.conform(rows, ORDERS_SCHEMA if kind.frame == "orders" else CREDITS_SCHEMA)


def _with_rows(frame: DataFrame, rows: DataFrame, column: str) -> DataFrame:
    """Return a cached frame with more rows, partitioned and sorted as it was: only the added rows are shuffled."""
    partitions = int(frame.sparkSession.conf.get("spark.sql.shuffle.partitions"))
    return frame.unionByName(rows.repartition(partitions, column)).sortWithinPartitions(column).cache()


def count_together(frames: dict[str, DataFrame]) -> dict[str, int]:
    """Count (and so fill the cache of) several frames in one Spark job."""
    union = None
    for name, df in frames.items():
        tagged = df.select(F.lit(name).alias("frame"))
        union = tagged if union is None else union.unionByName(tagged)
    counts = dict.fromkeys(frames, 0)
    if union is not None:
        for row in union.groupBy("frame").count().collect():
            counts[row.frame] = row["count"]
    return counts
