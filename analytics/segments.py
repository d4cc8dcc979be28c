"""Moving the differences, not the day: aggregates computed in each database, rows fetched where they disagree.

Each database computes, over the reported days' span of order ids [low, high], small aggregates of its own rows
(analytics/segment_sql.py): per user, the orders' count, 2 x total and row hashes, and the credits' of those orders
(wherever in time they were awarded); per bucket of order ids, the orders' and their outbox rows' count and hash,
bisected from wide buckets to small leaves where they disagree. Spark reads the aggregates over JDBC, pairs them and
names the users and leaves that disagree, plus a random audit of users whose rows are compared however their
aggregates look. Only those rows are fetched (analytics/fetch.py), with the few rows no segment covers (credits and
outbox rows of the period for orders outside the span, outbox rows still pending or dead, the orders of open dead
letters); the checks of analytics/checks.py then run on them unchanged, after the look-ups complete them
(analytics/lookups.py).
A violation always makes its segment disagree, so the counts and samples are those of the whole day.
"""

import math
import random
from dataclasses import dataclass
from datetime import timedelta

from django.db import connections
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from analytics import extract, jdbc, segment_sql
from analytics.period import Period

# Buckets a disagreeing range is split into at the next level, and the widest leaf (in order ids) whose rows are
# fetched: a leaf is a few hundred rows.
FANOUT = 32
LEAF = 256
# The first level's buckets at most: its one grouped scan of the span returns that many small rows a side (about 35
# bytes each), and a disagreeing bucket's children rescan only that bucket's ids, never a large share of the day
# (first-level buckets of 8,192 ids from 524,288 order ids in the span to 16.7M).
FIRST_LEVEL_BUCKETS = 2048
# Ranges (of users, of leaves) kept at most: beyond, the ranges widen (more rows fetched, never more driver memory).
MAX_RANGES = 10_000
# How long before the period a credit of its orders can have been written: an order's id and its created_at are
# taken a moment apart, so ids near midnight may cross it; far more than any transaction lasts.
CREDIT_KEY_MARGIN = timedelta(hours=1)
# Credits read along the primary key per credit of the span, at most, for that read to be chosen over looking each
# one up through the order_id index: a row read in key order costs the server a fraction of a look-up.
KEY_SCAN_ROWS_PER_CREDIT = 3


@dataclass
class Aggregates:
    """The reports' inputs computed in the databases: per user and day, new users per day, latency in ms counts."""

    orders_per_user: DataFrame  # user_id, date, rows, amount (2 x total), checksum, dated
    credits_per_user_day: DataFrame  # date, user_id, credits_awarded, credits_total
    new_users: DataFrame  # date, new_users
    latency: DataFrame  # date, latency_seconds, credits


@dataclass
class Span:
    """The reported days' order ids: every order placed in the period has an id in [low, high]; and the credits'
    and outbox rows' primary-key spans over the period, which turn their scans by time into key ranges.
    """

    low: int
    high: int
    credit_keys: tuple | None = None
    log_keys: tuple | None = None


# The aggregates' columns that hold hash sums, which the databases send in base segment_sql.HASH_BASE.
HASH_COLUMNS = ("checksum", "dated")


def read_sql(spark: SparkSession, source: jdbc.JdbcSource, sql: str) -> DataFrame:
    """Read a statement's result as a `dbtable` subquery (one partition: aggregates are small), its hash sums as
    decimals."""
    properties = {k: v for k, v in source.options().items() if k != "url"}
    df = spark.read.jdbc(source.url, f"({sql}) AS segment", properties=properties)
    return df.select(
        *[
            F.conv(c, segment_sql.HASH_BASE, 10).cast("decimal(38,0)").alias(c) if c in HASH_COLUMNS else c
            for c in df.columns
        ]
    )


def hash_total(hashes: Column) -> Column:
    """The sum of row hashes or of hash sums, reduced as the databases reduce theirs (segment_sql.exact_sum)."""
    return F.pmod(F.sum(hashes), F.lit(segment_sql.HASH_MODULUS).cast("decimal(38,0)"))


def per_user(orders_per_user: DataFrame) -> DataFrame:
    """The orders' aggregates per user and day summed over the days."""
    return orders_per_user.groupBy("user_id").agg(
        F.sum("rows").alias("rows"),
        F.sum("amount").alias("amount"),
        *[hash_total(F.col(c)).alias(c) for c in HASH_COLUMNS],
    )


def span_of(plan: extract.WindowPlan) -> Span:
    """The period's order id span, or an empty one (every credit and outbox row then counts as outside it)."""
    keys = {"credit_keys": (plan.credits.lower, plan.credits.upper), "log_keys": (plan.logs.lower, plan.logs.upper)}
    if plan.orders.lower is None:
        return Span(0, -1, **keys)
    return Span(int(plan.orders.lower), int(plan.orders.upper), **keys)


def credits_scan_start(source: jdbc.JdbcSource, span: Span, period: Period) -> int | None:
    """The credit key from which the credits of the span's orders are read in key order, or None to look them up
    through the order_id index: when the credits written since the period began are few enough (a run for last
    night; a rerun of a day long past reads the span's credits one by one instead).

    Every credit of an order in the span was written after the period began (less CREDIT_KEY_MARGIN), so its key is
    at least the first key written since then. A credit this misses could only make its user disagree and be fetched.
    """
    if span.low > span.high:
        return None
    with connections[source.alias].cursor() as cursor:
        cursor.execute(segment_sql.credit_keys_since(period.start - CREDIT_KEY_MARGIN))
        first, last = cursor.fetchone()
    if first is None or last - first + 1 > KEY_SCAN_ROWS_PER_CREDIT * (span.high - span.low + 1):
        return None
    return int(first)


def read_aggregates(spark: SparkSession, sources: jdbc.Sources, span: Span, period: Period) -> Aggregates:
    start, end = period.start, period.end
    latency = read_sql(spark, sources.credits, segment_sql.latency_histogram(start, end, span.credit_keys))
    return Aggregates(
        orders_per_user=read_sql(spark, sources.orders, segment_sql.orders_per_user(span.low, span.high)),
        credits_per_user_day=read_sql(
            spark, sources.credits, segment_sql.credits_per_user_day(start, end, span.credit_keys)
        ),
        new_users=read_sql(spark, sources.orders, segment_sql.new_users_per_day(max(span.low, 0), start, end)),
        latency=latency.select("date", (F.col("ms") / 1_000.0).alias("latency_seconds"), "credits"),
    )


def _eq(left: Column, right: Column) -> Column:
    return F.coalesce(left, F.lit(0)) == F.coalesce(right, F.lit(0))


def compare_users(orders_per_user: DataFrame, credits_per_user: DataFrame) -> DataFrame:
    """Per user: whether the orders of the span and their credits agree (user_id, agree).

    They agree when count, amount and hash sum agree and, if any of the user's credits carries ordered_at, all of
    them do and their ordered_at hash matches the orders' created_at hash (a user with older credits mixed in is
    fetched: only its rows can tell which credit is which).
    """
    o = per_user(orders_per_user).select(
        "user_id", *[F.col(c).alias(f"o_{c}") for c in ("rows", "amount", *HASH_COLUMNS)]
    )
    c = credits_per_user.select("user_id", *[F.col(n).alias(f"c_{n}") for n in credits_per_user.columns[1:]])
    dated_ok = (F.coalesce(F.col("c_dated_rows"), F.lit(0)) == 0) | (
        (F.col("c_dated_rows") == F.col("c_rows")) & _eq(F.col("o_dated"), F.col("c_dated"))
    )
    agree = (
        _eq(F.col("o_rows"), F.col("c_rows"))
        & _eq(F.col("o_amount"), F.col("c_amount"))
        & _eq(F.col("o_checksum"), F.col("c_checksum"))
        & dated_ok
    )
    return o.join(c, "user_id", "full_outer").select("user_id", agree.alias("agree"))


def audit_sample(compared: DataFrame, *, k: int, seed: int) -> DataFrame:
    """k users chosen at random (a seeded hash of the id, so a run is repeatable and each night differs)."""
    return compared.orderBy(F.xxhash64("user_id", F.lit(seed))).limit(k).select("user_id")


def recompute_users(orders: DataFrame, credits: DataFrame, span: Span) -> tuple[DataFrame, DataFrame]:
    """The per-user aggregates of fetched rows, computed in Spark the way the databases compute them."""

    def hashed(text: Column) -> Column:
        return F.shiftleft(F.crc32(text), 28).bitwiseXOR(F.crc32(F.reverse(text))).cast("decimal(20,0)")

    def pair(left: str, right: Column) -> Column:
        # NULL when either side is, as the databases' CONCAT is: a credit without ordered_at adds nothing to `dated`.
        return F.concat(F.col(left).cast("string"), F.lit(":"), right.cast("string"))

    def micros(column: str) -> Column:
        return F.unix_micros(F.col(column))

    in_span = F.col("id").between(span.low, span.high)
    o = (
        orders.where(in_span)
        .groupBy("user_id")
        .agg(
            F.count("*").alias("rows"),
            F.sum(F.col("total") * 2).alias("amount"),
            hash_total(hashed(pair("id", F.col("total") * 2))).alias("checksum"),
            hash_total(hashed(pair("id", micros("created_at")))).alias("dated"),
        )
    )
    c = (
        credits.where(F.col("order_id").between(span.low, span.high))
        .groupBy("user_id")
        .agg(
            F.count("*").alias("rows"),
            F.sum("total").alias("amount"),
            hash_total(hashed(pair("order_id", F.col("total")))).alias("checksum"),
            F.count("ordered_at").alias("dated_rows"),
            hash_total(hashed(pair("order_id", micros("ordered_at")))).alias("dated"),
        )
    )
    return o, c


def audit_mismatches(
    audited: DataFrame, database: tuple[DataFrame, DataFrame], fetched: tuple[DataFrame, DataFrame]
) -> DataFrame:
    """Audited users whose aggregates in a database differ from the same aggregates of their fetched rows."""
    (db_orders, db_credits), (rows_orders, rows_credits) = database, fetched
    db_orders = per_user(db_orders)

    def differing(db: DataFrame, rows: DataFrame) -> DataFrame:
        columns = [c for c in db.columns if c != "user_id"]
        d = audited.join(db, "user_id", "left").select("user_id", *[F.col(c).alias(f"d_{c}") for c in columns])
        r = audited.join(rows, "user_id", "left").select("user_id", *[F.col(c).alias(f"r_{c}") for c in columns])
        same = F.lit(True)
        for c in columns:
            same = same & _eq(F.col(f"d_{c}"), F.col(f"r_{c}"))
        return d.join(r, "user_id").where(~same).select("user_id")

    return differing(db_orders, rows_orders).unionByName(differing(db_credits, rows_credits)).distinct()


def bisect_outbox(
    spark: SparkSession,
    source: jdbc.JdbcSource,
    span: Span,
    facts: dict,
    *,
    leaf: int = LEAF,
    first_level: int = FIRST_LEVEL_BUCKETS,
) -> list[tuple[int, int]]:
    """Return the leaves (inclusive order id ranges) where orders and their outbox rows disagree.

    Buckets nest (each level's width divides the one before), so a disagreeing bucket's children are its own ids.
    Bisection stops at the leaf width, or early when more than MAX_RANGES buckets disagree (the ranges then are
    wider, and more rows are fetched).
    """
    if span.low > span.high:
        facts["outbox_levels"] = 0
        return []
    width = leaf
    while width * first_level < span.high - span.low + 1:
        width *= FANOUT
    ranges, level = [(span.low, span.high)], 0
    while ranges:
        level += 1
        orders_sql, logs_sql = segment_sql.ranges_compared(ranges, width)
        o = read_sql(spark, source, orders_sql).select(
            "bucket", F.col("rows").alias("o_rows"), F.col("checksum").alias("o_sum"), F.lit(1).alias("o_read")
        )
        lg = read_sql(spark, source, logs_sql).select(
            "bucket", F.col("rows").alias("l_rows"), F.col("checksum").alias("l_sum"), F.lit(1).alias("l_read")
        )
        agree = _eq(F.col("o_rows"), F.col("l_rows")) & _eq(F.col("o_sum"), F.col("l_sum"))
        # One job per level: every bucket either side returned, whether they agree, and how many rows it read (1, 2).
        paired = o.join(lg, "bucket", "full_outer")
        read = F.coalesce("o_read", F.lit(0)) + F.coalesce("l_read", F.lit(0))
        rows = paired.select("bucket", agree.alias("agree"), read.alias("read")).collect()
        facts["bucket_rows"] = facts.get("bucket_rows", 0) + sum(row.read for row in rows)
        buckets = sorted(row.bucket for row in rows if not row.agree)
        ranges = [(max(span.low, b * width), min(span.high, (b + 1) * width - 1)) for b in buckets]
        facts[f"outbox_level{level}_width"] = width
        facts[f"outbox_level{level}_differing"] = len(ranges)
        if width <= leaf or len(ranges) > MAX_RANGES:
            break
        width //= FANOUT
    facts["outbox_levels"] = level
    return _merged(ranges)


def _merged(ranges: list[tuple[int, int]], limit: int = MAX_RANGES) -> list[tuple[int, int]]:
    """Adjacent ranges joined, then, beyond `limit`, neighbours joined across the smallest gaps."""
    merged: list[tuple[int, int]] = []
    for low, high in sorted(ranges):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(high, merged[-1][1]))
        else:
            merged.append((low, high))
    while len(merged) > limit:
        step = math.ceil(len(merged) / limit)
        merged = [(merged[i][0], merged[min(i + step, len(merged)) - 1][1]) for i in range(0, len(merged), step)]
    return merged


def audit_seed(period: Period) -> int:
    """A seed per reported period: each night audits other users, and a rerun the same ones."""
    return random.Random(period.first.toordinal() * 1_000 + period.days).getrandbits(31)
