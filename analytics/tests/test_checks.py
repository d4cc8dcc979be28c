"""Each consistency check on small frames: what it reports, and what it must not."""

from datetime import date, timedelta

import pytest
from pyspark.testing import assertDataFrameEqual

from analytics.checks import (
    CHECK_NAMES,
    CheckContext,
    check_credit_amount_mismatch,
    check_credit_ordered_at_mismatch,
    check_dead_letters_open,
    check_duplicate_credit,
    check_log_without_order,
    check_missing_credit,
    check_order_without_log,
    check_orphan_credit,
    check_stuck_outbox,
    lookup_candidates,
    run_checks,
    transform_violations,
)
from analytics.period import Period
from analytics.tests.support import at

pytestmark = pytest.mark.spark

D20 = date(2026, 11, 20)
# Judged at 01:00 on the 21st with a 10-minute grace: anything after 00:50 is still in flight.
CTX = CheckContext(period=Period.ending(D20), as_of=at(21, 1), grace_seconds=600)


def test_contract_names_in_order():
    assert CHECK_NAMES == (
        "order_without_log",
        "log_without_order",
        "missing_credit",
        "credit_amount_mismatch",
        "credit_ordered_at_mismatch",
        "orphan_credit",
        "duplicate_credit",
        "stuck_outbox",
        "dead_letters_open",
    )


def test_order_without_log(spark, frames):
    orders = frames.orders((1, 10, 1, at(20, 8)), (2, 10, 1, at(20, 9)), (3, 10, 1, at(19, 9)))
    logs = frames.logs(("tx1", 1, "published", 1, at(20, 8), at(20, 8)))
    actual = check_order_without_log(orders, logs, CTX)
    expected = spark.createDataFrame(
        [(D20, 2, 10, 1, at(20, 9))], "date date, id long, user_id long, total long, created_at timestamp"
    )
    assertDataFrameEqual(actual, expected)


def test_log_without_order_ignores_other_days_and_reports_unparseable_keys(spark, frames):
    orders = frames.orders((1, 10, 1, at(20, 8)))
    logs = frames.logs(
        ("tx1", 1, "published", 1, at(20, 8), at(20, 8)),
        ("tx2", 2, "pending", 0, at(20, 9), None),
        ("tx3", None, "published", 1, at(20, 10), at(20, 10)),  # foreign_key was not a number
        ("tx4", 4, "published", 1, at(19, 9), at(19, 9)),  # another day
    )
    actual = check_log_without_order(logs, orders, CTX)
    expected = spark.createDataFrame(
        [(D20, "tx2", 2, "pending", at(20, 9)), (D20, "tx3", None, "published", at(20, 10))],
        "date date, id string, order_id long, status string, created_at timestamp",
    )
    assertDataFrameEqual(actual, expected)


def test_missing_credit_respects_the_grace_period(spark, frames):
    orders = frames.orders(
        (1, 10, 1, at(20, 8)),  # credited
        (2, 10, 2, at(20, 9)),  # missing
        (3, 10, 3, at(21, 0, 55)),  # next day anyway
        (4, 11, 4, at(20, 23, 59)),  # missing: placed 61 minutes before as_of
    )
    credits = frames.credits((100, 10, 1, 2, at(20, 8)))
    ctx = CheckContext(period=CTX.period, as_of=at(21, 1), grace_seconds=3_600)
    actual = check_missing_credit(orders, credits, ctx)
    expected = spark.createDataFrame(
        [(D20, 2, 10, 2, at(20, 9)), (D20, 4, 11, 4, at(20, 23, 59))],
        "date date, id long, user_id long, total long, created_at timestamp",
    )
    assertDataFrameEqual(actual, expected)
    in_flight = CheckContext(period=CTX.period, as_of=at(21, 0, 5), grace_seconds=3_600)
    assert [r.id for r in check_missing_credit(orders, credits, in_flight).collect()] == [2]


def test_credit_amount_mismatch(spark, frames):
    orders = frames.orders((1, 10, 3, at(20, 8)), (2, 10, 5, at(20, 9)))
    credits = frames.credits((100, 10, 1, 6, at(20, 8)), (101, 10, 2, 9, at(20, 9)))
    actual = check_credit_amount_mismatch(credits, orders, CTX)
    expected = spark.createDataFrame(
        [(D20, 101, 2, 10, 9)], "date date, id long, order_id long, expected long, actual long"
    )
    assertDataFrameEqual(actual, expected)


def test_credit_ordered_at_mismatch_judges_only_credits_that_carry_a_date(spark, frames):
    orders = frames.orders((1, 10, 3, at(20, 8)), (2, 10, 5, at(20, 9)), (3, 10, 1, at(20, 10)))
    credits = frames.credits(
        (100, 10, 1, 6, at(20, 8, 1), at(20, 8)),  # version 2, dated right
        (101, 10, 2, 10, at(20, 9, 1), at(20, 7)),  # version 2, dated wrong
        (102, 10, 3, 2, at(20, 10, 1)),  # version 1: no date to judge
    )
    actual = check_credit_ordered_at_mismatch(credits, orders, CTX)
    expected = spark.createDataFrame(
        [(D20, 101, 2, at(20, 9), at(20, 7))],
        "date date, id long, order_id long, expected timestamp, actual timestamp",
    )
    assertDataFrameEqual(actual, expected)


def test_orphan_credit(spark, frames):
    orders = frames.orders((1, 10, 3, at(20, 8)))
    credits = frames.credits((100, 10, 1, 6, at(20, 8)), (101, 11, 7, 4, at(20, 9)), (102, 11, 8, 4, at(19, 9)))
    actual = check_orphan_credit(credits, orders, CTX)
    expected = spark.createDataFrame(
        [(D20, 101, 7, 11, 4)], "date date, id long, order_id long, user_id long, total long"
    )
    assertDataFrameEqual(actual, expected)


def test_duplicate_credit_is_reported_on_the_day_of_the_latest_credit(spark, frames):
    credits = frames.credits(
        (100, 10, 1, 6, at(19, 8)),
        (101, 10, 1, 6, at(20, 8)),  # second credit for order 1, on the 20th
        (102, 10, 2, 4, at(20, 9)),
        (103, 10, 3, 4, at(20, 9)),
        (104, 10, 3, 4, at(20, 10)),
        (105, 10, 3, 4, at(21, 10)),  # order 3's latest credit is on the 21st: reported then, not now
    )
    actual = check_duplicate_credit(credits, CTX)
    expected = spark.createDataFrame(
        [(D20, 1, 2, [100, 101])], "date date, id long, credits long, credit_ids array<long>"
    )
    assertDataFrameEqual(actual, expected)


def test_stuck_outbox_counts_pending_and_dead_past_the_grace_period(spark, frames):
    logs = frames.logs(
        ("tx1", 1, "published", 1, at(20, 8), at(20, 8)),
        ("tx2", 2, "pending", 3, at(20, 9), None),
        ("tx3", 3, "dead", 10, at(20, 10), None),
        ("tx4", 4, "discarded", 2, at(20, 11), None),
        ("tx5", 5, "pending", 0, at(21, 0, 55), None),  # in flight (and another day)
        ("tx6", 6, "pending", 0, at(20, 23, 55), None),  # 5 minutes before as_of - grace: in flight
    )
    ctx = CheckContext(period=CTX.period, as_of=at(21, 0, 5), grace_seconds=600)
    actual = check_stuck_outbox(logs, ctx)
    expected = spark.createDataFrame(
        [(D20, "tx2", 2, "pending", 3, at(20, 9)), (D20, "tx3", 3, "dead", 10, at(20, 10))],
        "date date, id string, order_id long, status string, attempts long, created_at timestamp",
    )
    assertDataFrameEqual(actual, expected)


def test_dead_letters_open_for_orders_of_the_period(spark, frames):
    orders = frames.orders((1, 10, 3, at(20, 8)), (2, 10, 3, at(19, 8)))
    dead = frames.dead_letters(
        (7, 1, "open", at(20, 9)),
        (8, 1, "replayed", at(20, 9)),
        (9, 2, "open", at(20, 9)),  # its order is from the 19th
    )
    actual = check_dead_letters_open(dead, orders, CTX)
    expected = spark.createDataFrame([(D20, 7, 1, at(20, 9))], "date date, id long, order_id long, failed_at timestamp")
    assertDataFrameEqual(actual, expected)


def test_consistent_day_has_no_violations(spark, frames):
    orders = frames.orders((1, 10, 3, at(20, 8)), (2, 11, 1, at(20, 9)))
    logs = frames.logs(
        ("tx1", 1, "published", 1, at(20, 8), at(20, 8)), ("tx2", 2, "published", 1, at(20, 9), at(20, 9))
    )
    credits = frames.credits((100, 10, 1, 6, at(20, 8, 0, 2)), (101, 11, 2, 2, at(20, 9, 0, 1)))
    results = run_checks(orders=orders, logs=logs, credits=credits, dead_letters=frames.dead_letters(), ctx=CTX)
    assert {name: df.count() for name, df in results.items()} == dict.fromkeys(CHECK_NAMES, 0)


def test_violations_are_capped_per_check_and_day_with_the_full_count(spark, frames):
    orders = frames.orders(*[(i, 10, 1, at(20, 8)) for i in range(1, 6)])
    logs = frames.logs(("txa", 99, "pending", 0, at(20, 8), None))
    results = run_checks(
        orders=orders, logs=logs, credits=frames.credits(), dead_letters=frames.dead_letters(), ctx=CTX
    )
    rows = transform_violations(results, keep=2).select("check", "date", "entity_id", "count", "rank")
    expected = spark.createDataFrame(
        [
            ("order_without_log", D20, "1", 5, 1),
            ("order_without_log", D20, "2", 5, 2),
            ("log_without_order", D20, "txa", 1, 1),
            ("missing_credit", D20, "1", 5, 1),
            ("missing_credit", D20, "2", 5, 2),
            ("stuck_outbox", D20, "txa", 1, 1),
        ],
        "check string, date date, entity_id string, count long, rank int",
    )
    assertDataFrameEqual(rows, expected)


def test_lookup_candidates_name_what_the_window_did_not_contain(spark, frames):
    orders = frames.orders((1, 10, 3, at(20, 8)), (2, 10, 3, at(20, 9)))
    logs = frames.logs(("tx1", 1, "published", 1, at(20, 8), at(20, 8)), ("tx9", 9, "published", 1, at(20, 9), None))
    credits = frames.credits((100, 10, 2, 6, at(20, 9)), (101, 10, 7, 6, at(20, 9)))
    actual = lookup_candidates(orders=orders, logs=logs, credits=credits, ctx=CTX)
    expected = spark.createDataFrame([("order", 7), ("order", 9), ("credit", 1), ("log", 2)], "kind string, id long")
    assertDataFrameEqual(actual, expected)


def test_grace_cutoff():
    assert CTX.cutoff == at(21, 1) - timedelta(minutes=10)
