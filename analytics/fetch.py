"""Reading the rows where the segments disagree (analytics/segments.py names them), and those no segment covers.

The users that disagree or are audited are read by ranges of user ids, the outbox leaves and open dead letters' orders
by ranges of order ids; every order read comes with its outbox rows and credits. What no segment covers is read by its
own condition (analytics/segment_sql.py): credits of the period for orders outside the span, outbox rows of the period
not covered by the ranges, outbox rows still pending or dead.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from analytics import extract, jdbc, segment_sql
from analytics.lookups import candidate_ranges
from analytics.period import Period
from analytics.schemas import CREDITS_SCHEMA, FIRST_ORDERS_SCHEMA, ORDERS_SCHEMA
from analytics.segments import MAX_RANGES, Span


def _fetch(
    spark: SparkSession,
    source: jdbc.JdbcSource,
    table: extract.Table,
    pieces: list,
    condition: Callable[[list], str],
) -> list[DataFrame]:
    """Read a table's rows for pieces of a set of ranges, about one partition per core the source reads with."""
    if not pieces:
        return []
    size = max(1, min(math.ceil(len(pieces) / source.partitions), extract.RANGES_PER_QUERY))
    predicates = [f"({condition(pieces[i : i + size])})" for i in range(0, len(pieces), size)]
    return [extract.read_table(spark, source, table, predicates)]


@dataclass
class Fetched:
    orders: DataFrame
    credits: DataFrame
    logs: DataFrame


def fetch_differences(
    spark: SparkSession,
    sources: jdbc.Sources,
    span: Span,
    period: Period,
    *,
    users: DataFrame,
    leaves: list[tuple[int, int]],
    dead_letter_orders: DataFrame,
) -> Fetched:
    """Read the rows of the users and leaves that disagree, and those no segment covers.

    Every order read comes with its outbox rows and credits, whichever segment named it: else the checks would name
    each as a candidate, and the look-ups read them after all (analytics/lookups.py) and run the checks again.
    """
    start, end = period.start, period.end
    ranges = _as_ranges(
        users=users.select(F.col("user_id").alias("id")),
        dead=dead_letter_orders.select(F.col("order_id").alias("id")).where(F.col("id").isNotNull()),
    )
    user_ranges, dead_ranges = ranges["users"], ranges["dead"]
    lo, hi = span.low, span.high
    wanted = users.select("user_id")
    # Order ids read for their ranges (outbox leaves, dead letters): the same ranges on every table.
    id_ranges = leaves + dead_ranges

    def of_users(frames: list[DataFrame]) -> list[DataFrame]:
        # A user's rows are read by ranges of user ids; rows of users between the wanted ones are dropped here.
        return [df.join(wanted, "user_id", "left_semi") for df in frames]

    users_orders = [
        extract.conform(df, ORDERS_SCHEMA)
        for df in of_users(
            _fetch(spark, sources.orders, extract.ORDERS, user_ranges, lambda p: segment_sql.orders_of_users(lo, hi, p))
        )
    ]
    orders = [
        *users_orders,
        *[
            extract.conform(df, ORDERS_SCHEMA)
            for df in _fetch(spark, sources.orders, extract.ORDERS, id_ranges, segment_sql.orders_in)
        ],
    ]
    credits = [
        *of_users(
            _fetch(
                spark, sources.credits, extract.CREDITS, user_ranges, lambda p: segment_sql.credits_of_users(lo, hi, p)
            )
        ),
        # What the look-ups read credits by: their order ids, in ranges.
        *_present(extract.read_missing(spark, sources.credits, extract.CREDITS, column="order_id", ranges=id_ranges)),
        *_fetch(
            spark,
            sources.credits,
            extract.CREDITS,
            [0],
            lambda _: segment_sql.late_credits(lo, hi, start, end, span.credit_keys),
        ),
    ]
    logs = [
        extract.conform_logs(df)
        for df in [
            *_fetch(spark, sources.orders, extract.LOGS, id_ranges, segment_sql.logs_in),
            *_fetch(
                spark,
                sources.orders,
                extract.LOGS,
                [0],
                lambda _: segment_sql.late_logs(lo, hi, start, end, span.log_keys),
            ),
            *_fetch(spark, sources.orders, extract.LOGS, [0], lambda _: segment_sql.unpublished_logs(start, end)),
        ]
    ]
    for users_of in users_orders:
        # The outbox rows of the users' orders, by ranges of those orders' ids (the outbox has no user id). The
        # orders are cached: the ranges and the frame read them once. Wide ranges also read rows of other orders,
        # which the semi-join drops.
        users_of = users_of.cache()
        ids = users_of.select(F.col("id").alias("order_id"))
        logs += [
            extract.conform_logs(df).join(ids, "order_id", "left_semi")
            for df in _fetch(
                spark, sources.orders, extract.LOGS, _as_ranges(orders=users_of)["orders"], segment_sql.logs_in
            )
        ]
    return Fetched(
        orders=_union(orders, spark, ORDERS_SCHEMA),
        credits=_union([extract.conform(df, CREDITS_SCHEMA) for df in credits], spark, CREDITS_SCHEMA),
        logs=_union(logs, spark, None),
    )


def _present(df: DataFrame | None) -> list[DataFrame]:
    return [] if df is None else [df]


def _as_ranges(**frames: DataFrame) -> dict[str, list[tuple[int, int]]]:
    """Per name, id ranges covering its frame's `id` column, every frame's in one Spark job."""
    union = None
    for name, df in frames.items():
        tagged = df.select(F.lit(name).alias("kind"), "id")
        union = tagged if union is None else union.unionByName(tagged)
    found = candidate_ranges(union, MAX_RANGES)
    return {name: found.get(name, []) for name in frames}


def _union(frames: list[DataFrame], spark: SparkSession, schema) -> DataFrame:
    if not frames:
        return spark.createDataFrame([], schema)
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    # A row reached by two paths (a user's order that is also in a leaf) is one row.
    return union.dropDuplicates(["id"])


def empty_first_orders(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame([], FIRST_ORDERS_SCHEMA)
