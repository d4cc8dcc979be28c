"""Each credit-analytics transform on small frames."""

from datetime import date

import pytest
from pyspark.testing import assertDataFrameEqual

from analytics.period import Period
from analytics.schemas import DAILY_HISTORY_SCHEMA, FIRST_ORDERS_SCHEMA
from analytics.tests.support import at
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

pytestmark = pytest.mark.spark

DAY = Period.ending(date(2026, 11, 20))
D20, D19, D21 = date(2026, 11, 20), date(2026, 11, 19), date(2026, 11, 21)


@pytest.fixture
def orders(frames):
    return frames.orders(
        (1, 10, 3, at(19, 23, 59, 50)),  # the day before: its credit lands on the 20th
        (2, 10, 2, at(20, 0, 0, 0)),  # first instant of the day
        (3, 11, 5, at(20, 9)),
        (4, 10, 1, at(20, 23, 59, 59)),  # credited after midnight, on the 21st
        (5, 12, 4, at(21, 0, 0, 0)),  # first instant of the next day: not in the period
    )


@pytest.fixture
def credits(frames):
    return frames.credits(
        (100, 10, 1, 6, at(20, 0, 0, 5)),  # 15 s after its order
        (101, 10, 2, 4, at(20, 0, 0, 2)),  # 2 s
        (102, 11, 3, 10, at(20, 9, 0, 10)),  # 10 s
        (103, 10, 4, 2, at(21, 0, 0, 30)),  # 31 s, awarded on the 21st
    )


def test_user_daily_counts_orders_by_placement_and_credits_by_award_day(spark, orders, credits):
    actual = transform_user_daily(orders, credits, DAY)
    expected = spark.createDataFrame(
        [(D20, 10, 2, 3, 2, 10), (D20, 11, 1, 5, 1, 10)],
        "date date, user_id long, orders long, order_units long, credits_awarded long, credits_total long",
    )
    assertDataFrameEqual(actual, expected)


def test_user_daily_keeps_users_with_only_credits_or_only_orders(spark, frames):
    orders = frames.orders((1, 10, 3, at(20, 8)))
    credits = frames.credits((7, 11, 99, 8, at(20, 9)))
    actual = transform_user_daily(orders, credits, DAY)
    expected = spark.createDataFrame(
        [(D20, 10, 1, 3, 0, 0), (D20, 11, 0, 0, 1, 8)],
        "date date, user_id long, orders long, order_units long, credits_awarded long, credits_total long",
    )
    assertDataFrameEqual(actual, expected)


def test_daily_metrics_counts_new_users_by_their_first_order(spark, orders, credits):
    period = Period.ending(D21, days=2)
    user_daily = transform_user_daily(orders, credits, period)
    # User 10's first order ever is order 1 (on the 19th), so 10 is not new on the 20th; 11 and 12 are new.
    first_orders = spark.createDataFrame([(11, 3), (12, 5)], FIRST_ORDERS_SCHEMA)
    actual = transform_daily_metrics(user_daily, orders, first_orders, period)
    expected = spark.createDataFrame(
        [(D20, 3, 8, 2, 1, 2, 3, 20), (D21, 1, 4, 1, 1, 1, 1, 2)],
        "date date, orders long, order_units long, users long, new_users long, credited_users long, "
        "credits_awarded long, credits_total long",
    )
    assertDataFrameEqual(actual, expected)


def test_daily_metrics_gives_a_quiet_day_a_row_of_zeros(spark, frames):
    empty_orders, empty_credits = frames.orders(), frames.credits()
    user_daily = transform_user_daily(empty_orders, empty_credits, DAY)
    first_orders = spark.createDataFrame([], FIRST_ORDERS_SCHEMA)
    actual = transform_daily_metrics(user_daily, empty_orders, first_orders, DAY)
    expected = spark.createDataFrame(
        [(D20, 0, 0, 0, 0, 0, 0, 0)],
        "date date, orders long, order_units long, users long, new_users long, credited_users long, "
        "credits_awarded long, credits_total long",
    )
    assertDataFrameEqual(actual, expected)


@pytest.fixture
def user_daily(spark):
    rows = [(D20, user, 1, 1, 1, total) for user, total in [(1, 2), (2, 4), (3, 6), (4, 8), (5, 100)]]
    rows += [(D20, 6, 1, 3, 0, 0), (D19, 1, 1, 1, 1, 30)]
    return spark.createDataFrame(
        rows,
        "date date, user_id long, orders long, order_units long, credits_awarded long, credits_total long",
    )


def test_credit_distribution_is_exact_over_credited_users(spark, user_daily):
    actual = transform_credit_distribution(user_daily)
    # Values 2, 4, 6, 8, 100: p50 = 6; p90 interpolates 8 + 0.6 * 92; p99 = 8 + 0.96 * 92.
    expected = spark.createDataFrame(
        [(D20, 5, 6.0, 63.2, 96.32, 100, 24.0), (D19, 1, 30.0, 30.0, 30.0, 30, 30.0)],
        "date date, users long, p50 double, p90 double, p99 double, max long, mean double",
    )
    assertDataFrameEqual(actual, expected)


def test_credit_histogram_lists_every_bucket(spark, user_daily):
    actual = transform_credit_histogram(user_daily.where("date = '2026-11-20'"), buckets=(1, 5, 50))
    expected = spark.createDataFrame(
        [(D20, 0, 1, 5, 2), (D20, 1, 5, 50, 2), (D20, 2, 50, None, 1)],
        "date date, bucket int, lower long, upper long, users long",
    )
    assertDataFrameEqual(actual, expected)


def test_top_users_ranks_by_credits_then_user_id(spark, user_daily):
    tied = user_daily.unionByName(user_daily.sparkSession.createDataFrame([(D20, 9, 2, 2, 2, 8)], user_daily.schema))
    actual = transform_top_users(tied, n=3)
    expected = spark.createDataFrame(
        [(D20, 1, 5, 100, 1, 1), (D20, 2, 4, 8, 1, 1), (D20, 3, 9, 8, 2, 2), (D19, 1, 1, 30, 1, 1)],
        "date date, rank int, user_id long, credits_total long, credits_awarded long, orders long",
    )
    assertDataFrameEqual(actual, expected)


def test_award_latency_joins_each_credit_of_the_period_to_its_order(spark, orders, credits):
    actual = transform_award_latency(credits, orders, DAY)
    expected = spark.createDataFrame(
        [(D20, 100, 15.0), (D20, 101, 2.0), (D20, 102, 10.0)],
        "date date, credit_id long, latency_seconds double",
    )
    assertDataFrameEqual(actual, expected)


def test_latency_summary_percentiles(spark):
    latency = spark.createDataFrame(
        [(D20, i, float(s)) for i, s in enumerate([1, 2, 3, 4, 5, 6, 7, 8, 9, 100])],
        "date date, credit_id long, latency_seconds double",
    )
    actual = transform_latency_summary(latency)
    # p50 interpolates 5 and 6; p95 = 9 + 0.55 * 91; p99 = 9 + 0.91 * 91.
    expected = spark.createDataFrame(
        [(D20, 10, 5.5, 59.05, 91.81, 100.0)],
        "date date, credits long, p50 double, p95 double, p99 double, max double",
    )
    assertDataFrameEqual(actual, expected)


def test_latency_histogram(spark):
    latency = spark.createDataFrame(
        [(D20, 1, 0.4), (D20, 2, 1.0), (D20, 3, 7.5), (D20, 4, 4000.0)],
        "date date, credit_id long, latency_seconds double",
    )
    actual = transform_latency_histogram(latency, buckets=(0, 1, 5, 3600))
    expected = spark.createDataFrame(
        [(D20, 0, 0, 1, 1), (D20, 1, 1, 5, 1), (D20, 2, 5, 3600, 1), (D20, 3, 3600, None, 1)],
        "date date, bucket int, lower long, upper long, credits long",
    )
    assertDataFrameEqual(actual, expected)


def test_trend_merges_history_with_this_run_and_leaves_gaps(spark):
    metrics = (
        "date date, orders long, order_units long, users long, new_users long, credited_users long, "
        "credits_awarded long, credits_total long"
    )
    history = spark.createDataFrame([(D19, 5, 5, 5, 5, 5, 5, 10), (D20, 1, 1, 1, 1, 1, 1, 2)], DAILY_HISTORY_SCHEMA)
    # This run recomputed the 20th: its numbers replace the stored ones.
    current = spark.createDataFrame([(D20, 7, 7, 7, 7, 7, 7, 14)], metrics)
    actual = transform_trend(history, current, DAY, days=3)
    expected = spark.createDataFrame(
        [
            (D20, date(2026, 11, 18), None, None, None, None, None, None, None),
            (D20, D19, 5, 5, 5, 5, 5, 5, 10),
            (D20, D20, 7, 7, 7, 7, 7, 7, 14),
        ],
        "report_date date, " + metrics,
    )
    assertDataFrameEqual(actual, expected)
