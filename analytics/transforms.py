"""Credit analytics as pure DataFrame -> DataFrame functions (no I/O; the tests feed them small frames).

Every result is keyed by `date`, the UTC day, so one run can report one day or a month with the same code.
Orders count on the day they were placed, credits on the day they were awarded.
"""

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from analytics.period import Period

TOP_USERS = 10
TREND_DAYS = 30
PERCENTILES = (0.5, 0.9, 0.99)
LATENCY_PERCENTILES = (0.5, 0.95, 0.99)
# Lower edges of the histogram buckets; the last bucket is open-ended.
CREDIT_BUCKETS = (1, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000)
LATENCY_BUCKETS_SECONDS = (0, 1, 2, 5, 10, 30, 60, 300, 600, 3_600)


def in_period(df: DataFrame, period: Period, column: str = "created_at") -> DataFrame:
    """Keep the rows whose `column` falls on one of the period's days."""
    return df.where((F.col(column) >= F.lit(period.start)) & (F.col(column) < F.lit(period.end)))


def day_of(column: str = "created_at") -> Column:
    """The UTC day of a timestamp column (the session time zone is UTC)."""
    return F.to_date(F.col(column)).alias("date")


def period_dates(df: DataFrame, period: Period) -> DataFrame:
    """One row per day of the period, so days without any activity still get a row of zeros."""
    return df.sparkSession.range(period.days).select(
        F.date_add(F.lit(period.first), F.col("id").cast("int")).alias("date")
    )


def transform_user_daily(orders: DataFrame, credits: DataFrame, period: Period) -> DataFrame:
    """Per user per day: orders placed, units ordered, credits awarded (rows) and credits total."""
    # One aggregation over both inputs rather than two aggregations and a full outer join: a single shuffle.
    placed = in_period(orders, period).select(
        day_of(),
        "user_id",
        F.lit(1).alias("orders"),
        F.col("total").alias("order_units"),
        F.lit(0).alias("credits_awarded"),
        F.lit(0).alias("credits_total"),
    )
    awarded = in_period(credits, period).select(
        day_of(),
        "user_id",
        F.lit(0).alias("orders"),
        F.lit(0).alias("order_units"),
        F.lit(1).alias("credits_awarded"),
        F.col("total").alias("credits_total"),
    )
    counts = ["orders", "order_units", "credits_awarded", "credits_total"]
    return placed.unionByName(awarded).groupBy("date", "user_id").agg(*[F.sum(c).cast("long").alias(c) for c in counts])


def transform_daily_metrics(
    user_daily: DataFrame, orders: DataFrame, first_orders: DataFrame, period: Period
) -> DataFrame:
    """Per day: orders, units, distinct and new users, credits awarded and their total.

    A new user is one whose first order ever was placed that day (first_orders: user_id, first_order_id).
    """
    # Each user has exactly one first order, so counting first orders counts new users.
    firsts = (
        in_period(orders, period)
        .join(first_orders.select("first_order_id"), F.col("id") == F.col("first_order_id"))
        .groupBy(day_of())
        .agg(F.count("*").alias("new_users"))
    )
    return transform_daily_metrics_counted(user_daily, firsts, period)


def transform_daily_metrics_counted(user_daily: DataFrame, new_users: DataFrame, period: Period) -> DataFrame:
    """Per day: the daily metrics from the per-user rows and the new users counted per day (date, new_users)."""
    totals = user_daily.groupBy("date").agg(
        F.sum("orders").alias("orders"),
        F.sum("order_units").alias("order_units"),
        F.count_if(F.col("orders") > 0).alias("users"),
        F.count_if(F.col("credits_awarded") > 0).alias("credited_users"),
        F.sum("credits_awarded").alias("credits_awarded"),
        F.sum("credits_total").alias("credits_total"),
    )
    columns = ["orders", "order_units", "users", "new_users", "credited_users", "credits_awarded", "credits_total"]
    return (
        period_dates(user_daily, period)
        .join(totals, "date", "left")
        .join(new_users.select("date", "new_users"), "date", "left")
        .fillna(0, subset=columns)
        .select("date", *[F.col(c).cast("long").alias(c) for c in columns])
    )


def transform_user_daily_counted(
    orders_per_user: DataFrame, credits_per_user_day: DataFrame, period: Period
) -> DataFrame:
    """transform_user_daily's rows from counts the databases made: orders per user and day (rows, amount =
    2 x total) and credits per day and user (credits_awarded, credits_total); days outside the period dropped.
    """
    dates = [F.lit(d) for d in period.dates]
    placed = orders_per_user.where(F.col("date").isin(*dates)).select(
        F.col("date").cast("date").alias("date"),
        F.col("user_id").cast("long").alias("user_id"),
        F.col("rows").alias("orders"),
        (F.col("amount") / 2).alias("order_units"),
        F.lit(0).alias("credits_awarded"),
        F.lit(0).alias("credits_total"),
    )
    awarded = credits_per_user_day.where(F.col("date").isin(*dates)).select(
        F.col("date").cast("date").alias("date"),
        F.col("user_id").cast("long").alias("user_id"),
        F.lit(0).alias("orders"),
        F.lit(0).alias("order_units"),
        "credits_awarded",
        "credits_total",
    )
    counts = ["orders", "order_units", "credits_awarded", "credits_total"]
    return placed.unionByName(awarded).groupBy("date", "user_id").agg(*[F.sum(c).cast("long").alias(c) for c in counts])


def transform_credit_distribution(user_daily: DataFrame) -> DataFrame:
    """Per day, over the users credited that day: exact percentiles, max and mean of their credits total."""
    credited = user_daily.where(F.col("credits_total") > 0)
    pct = F.percentile(F.col("credits_total"), list(PERCENTILES))
    return credited.groupBy("date").agg(
        F.count("*").alias("users"),
        *[pct[i].alias(f"p{_pct_name(p)}") for i, p in enumerate(PERCENTILES)],
        F.max("credits_total").alias("max"),
        F.avg("credits_total").alias("mean"),
    )


def transform_credit_histogram(user_daily: DataFrame, buckets: Sequence[int] = CREDIT_BUCKETS) -> DataFrame:
    """Per day and bucket of credits total: how many users fell in it (every bucket listed, zeros included)."""
    credited = user_daily.where(F.col("credits_total") > 0).select("date", F.col("credits_total").alias("value"))
    return _histogram(credited, buckets, label="users")


def transform_award_latency(credits: DataFrame, orders: DataFrame, period: Period) -> DataFrame:
    """Per credit awarded in the period: seconds, to the millisecond, from the order being placed to the credit.

    Milliseconds keep the exact percentiles cheap: a day's latencies have thousands of distinct values, not one per
    credit as microseconds would.
    """
    awarded = in_period(credits, period).alias("c")
    micros = F.unix_micros(F.col("c.created_at")) - F.unix_micros(F.col("o.created_at"))
    return awarded.join(orders.alias("o"), F.col("c.order_id") == F.col("o.id")).select(
        F.to_date(F.col("c.created_at")).alias("date"),
        F.col("c.id").alias("credit_id"),
        (F.round(micros / 1_000) / 1_000.0).alias("latency_seconds"),
    )


def transform_latency_summary(latency: DataFrame) -> DataFrame:
    """Per day: how many credits, and their latency p50/p95/p99 and max in seconds.

    `latency` has a row per credit, or (with a `credits` column) a row per distinct latency and day counting the
    credits that took it (a histogram of whole milliseconds, as the database counts it): the percentiles are exact
    either way.
    """
    weight = _weight(latency, "credits")
    pct = F.percentile(F.col("latency_seconds"), list(LATENCY_PERCENTILES), weight)
    return latency.groupBy("date").agg(
        F.sum(weight).cast("long").alias("credits"),
        *[pct[i].alias(f"p{_pct_name(p)}") for i, p in enumerate(LATENCY_PERCENTILES)],
        F.max("latency_seconds").alias("max"),
    )


def transform_latency_histogram(latency: DataFrame, buckets: Sequence[int] = LATENCY_BUCKETS_SECONDS) -> DataFrame:
    """Per day and latency bucket (seconds): how many credits were awarded that fast."""
    values = latency.select(
        "date", F.col("latency_seconds").alias("value"), _weight(latency, "credits").alias("weight")
    )
    return _histogram(values, buckets, label="credits")


def _weight(df: DataFrame, column: str) -> Column:
    """How many a row counts for: its `column` when the frame is a histogram, else 1."""
    return F.col(column).cast("long") if column in df.columns else F.lit(1).cast("long")


def transform_top_users(user_daily: DataFrame, n: int = TOP_USERS) -> DataFrame:
    """Per day, the n users awarded the most credits (ties broken by the smaller user id)."""
    ranking = Window.partitionBy("date").orderBy(F.col("credits_total").desc(), F.col("user_id").asc())
    return (
        user_daily.where(F.col("credits_total") > 0)
        .withColumn("rank", F.row_number().over(ranking))
        .where(F.col("rank") <= n)
        .select("date", "rank", "user_id", "credits_total", "credits_awarded", "orders")
    )


def transform_trend(history: DataFrame, current: DataFrame, period: Period, days: int = TREND_DAYS) -> DataFrame:
    """For each reported day, its last `days` days of daily metrics (from earlier runs, or this one).

    Days no run has reported on have null metrics: a gap in the chart rather than a misleading zero.
    """
    columns = [c for c in current.columns if c != "date"]
    computed = current.select("date", *columns)
    earlier = history.join(computed.select("date"), "date", "left_anti").select("date", *columns)
    metrics = earlier.unionByName(computed)
    report_dates = period_dates(current, period).withColumnRenamed("date", "report_date")
    spans = report_dates.select(
        "report_date",
        F.explode(F.sequence(F.date_sub(F.col("report_date"), days - 1), F.col("report_date"))).alias("date"),
    )
    return spans.join(metrics, "date", "left").select("report_date", "date", *columns)


def _histogram(values: DataFrame, buckets: Sequence[int], *, label: str) -> DataFrame:
    """Count `value` per date into buckets [buckets[i], buckets[i+1]), listing every bucket of every date.

    One aggregation with a counter per bucket, then unpivoted: a single shuffle, and empty buckets come out as 0.
    """
    # A row counts `weight` times when it has one (a histogram's counts), else once.
    weight = _weight(values, "weight")
    bucket = F.lit(0)
    for index, lower in enumerate(buckets[1:], start=1):
        bucket = F.when(F.col("value") >= lower, F.lit(index)).otherwise(bucket)
    counts = (
        values.withColumn("bucket", bucket)
        .groupBy("date")
        .agg(
            *[
                F.sum(F.when(F.col("bucket") == i, weight).otherwise(0)).alias(f"bucket_{i}")
                for i in range(len(buckets))
            ]
        )
    )
    rows = F.array(
        *[
            F.struct(
                F.lit(i).alias("bucket"),
                F.lit(lower).cast("long").alias("lower"),
                F.lit(buckets[i + 1] if i + 1 < len(buckets) else None).cast("long").alias("upper"),
                F.col(f"bucket_{i}").alias(label),
            )
            for i, lower in enumerate(buckets)
        ]
    )
    return counts.select("date", F.inline(rows))


def _pct_name(p: float) -> str:
    return f"{round(p * 100):d}"
