"""The comparisons' plain SQL (analytics/segment_sql.py) against the models and the databases they run on.

Every statement names its tables and columns from the models' `_meta`: a model whose column is renamed changes
the statement, and every statement runs on the migrated test databases (one that names a column the table lacks
fails here, not at night).
"""

import zlib
from datetime import UTC, date, datetime

import pytest
from django.db import connections, router

from analytics import jdbc, segment_sql, segments
from analytics.period import Period
from credits.models import OrderCredit
from demo.seed import seed_demo_data
from orders.models import Order
from outbox.models import TransactionLog

pytestmark = pytest.mark.django_db(databases=["default", "credits"])

START, END = datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 11, 2, tzinfo=UTC)


def run(model, sql: str) -> list:
    with connections[router.db_for_read(model)].cursor() as cursor:
        cursor.execute(sql)
        return list(cursor.fetchall())


QUERIES = {
    "orders per user": (Order, lambda: segment_sql.orders_per_user(1, 10)),
    "credits per user": (OrderCredit, lambda: segment_sql.credits_per_user(1, 10)),
    "credits per user by key": (OrderCredit, lambda: segment_sql.credits_per_user(1, 10, from_key=3)),
    "credits per user and day": (OrderCredit, lambda: segment_sql.credits_per_user_day(START, END, (1, 5))),
    "latency histogram": (OrderCredit, lambda: segment_sql.latency_histogram(START, END, (1, 5))),
    "new users per day": (Order, lambda: segment_sql.new_users_per_day(1, START, END)),
    "orders per bucket": (Order, lambda: segment_sql.ranges_compared([(1, 10), (95, 120)], 8)[0]),
    "outbox rows per bucket": (TransactionLog, lambda: segment_sql.ranges_compared([(1, 10), (95, 120)], 8)[1]),
}
CONDITIONS = {
    "late credits": (OrderCredit, lambda: segment_sql.late_credits(1, 10, START, END)),
    "late outbox rows": (TransactionLog, lambda: segment_sql.late_logs(1, 10, START, END)),
    "late credits by key": (OrderCredit, lambda: segment_sql.late_credits(1, 10, START, END, (3, 9))),
    "late outbox rows by key": (TransactionLog, lambda: segment_sql.late_logs(1, 10, START, END, ("0a", "0f"))),
    "unpublished outbox rows": (TransactionLog, lambda: segment_sql.unpublished_logs(START, END)),
    "orders of users": (Order, lambda: segment_sql.orders_of_users(1, 10, [(1, 3), (7, 7)])),
    "credits of users": (OrderCredit, lambda: segment_sql.credits_of_users(1, 10, [(1, 3)])),
    "orders in ranges": (Order, lambda: segment_sql.orders_in([(1, 3), (9, 12)])),
    "outbox rows in ranges": (TransactionLog, lambda: segment_sql.logs_in([(8, 12)])),
}


@pytest.mark.parametrize("name", QUERIES)
def test_every_aggregate_runs_on_its_own_database(name):
    model, build = QUERIES[name]
    assert run(model, build()) == []  # empty tables: the statement parses and names real columns


@pytest.mark.parametrize("name", CONDITIONS)
def test_every_fetch_condition_runs_on_its_own_table(name):
    model, build = CONDITIONS[name]
    assert run(model, f"SELECT COUNT(*) FROM {model._meta.db_table} WHERE {build()}") == [(0,)]  # noqa: S608


def test_names_come_from_the_models():
    t = segment_sql.tables()
    assert (t.orders, t.credits, t.logs) == ("orders", "order_credits", "transaction_log")
    for model, columns in ((Order, t.order), (OrderCredit, t.credit), (TransactionLog, t.log)):
        assert columns == {name: model._meta.get_field(name).column for name in columns}
    # The credit's amount is stored in a column named `total`: only _meta knows.
    assert t.credit["amount"] == "total" and "SUM(total)" in segment_sql.credits_per_user(1, 2)


def test_a_renamed_column_changes_the_statements(monkeypatch):
    monkeypatch.setattr(OrderCredit._meta.get_field("amount"), "column", "credits")
    monkeypatch.setattr(Order._meta, "db_table", "purchases")
    assert "SUM(credits)" in segment_sql.credits_per_user(1, 2)
    assert "FROM purchases" in segment_sql.orders_per_user(1, 2)


def test_both_sides_hash_the_same_text_to_the_same_exact_sum():
    text = "12345:40"
    [(order_side,)] = run(Order, f"SELECT {segment_sql.row_hash(segment_sql.pair('12345', '2 * 20'))}")
    [(credit_side,)] = run(OrderCredit, f"SELECT {segment_sql.row_hash(repr(text))}")
    expected = (zlib.crc32(text.encode()) << 28) ^ zlib.crc32(text[::-1].encode())
    assert order_side == credit_side == expected < 2**60
    # Summed exactly, then reduced modulo 2^60 and written in base 36: (2^60 - 1) + (2^60 - 1) + 3 is 2^61 + 1.
    rows = f"SELECT {2**60 - 1} AS x UNION ALL SELECT {2**60 - 1} UNION ALL SELECT 3"
    [(total,)] = run(Order, f"SELECT {segment_sql.exact_sum('x')} FROM ({rows}) t")  # noqa: S608
    assert total == "1"
    [(largest,)] = run(Order, f"SELECT {segment_sql.exact_sum('x')} FROM (SELECT {2**60 - 1} AS x) t")  # noqa: S608
    assert int(largest, segment_sql.HASH_BASE) == 2**60 - 1 and len(largest) == 12


def test_a_key_span_narrows_a_scan_by_time_to_a_key_range():
    assert segment_sql.keys_within("id", (3, 9)) == "id BETWEEN 3 AND 9 AND "
    assert segment_sql.keys_within("id", ("0a", "0f")) == "id BETWEEN '0a' AND '0f' AND "
    # Keys of no known shape, or an empty period, narrow nothing (the time condition alone decides).
    assert segment_sql.keys_within("id", ("legacy'", "x")) == ""
    assert segment_sql.keys_within("id", (None, None)) == "" == segment_sql.keys_within("id", None)


def test_the_span_s_credits_read_in_key_order_are_those_the_order_id_index_finds(committed_db):
    # The seed commits on connections of its own.
    day = date(2026, 11, 20)
    seed_demo_data(orders=300, days=5, users=15, end=day, seed=5)
    source = jdbc.jdbc_source(router.db_for_read(OrderCredit))

    def span_of(period: Period) -> segments.Span:
        ids = Order.objects.filter(created_at__gte=period.start, created_at__lt=period.end).values_list("id", flat=True)
        return segments.Span(min(ids), max(ids))

    last_night, span = Period.ending(day), span_of(Period.ending(day))
    from_key = segments.credits_scan_start(source, span, last_night)
    # The earlier days' credits are not read; the span's are, whichever way.
    assert OrderCredit.objects.filter(id__lt=from_key).count() > 100
    by_key = run(OrderCredit, segment_sql.credits_per_user(span.low, span.high, from_key))
    assert sorted(by_key) == sorted(run(OrderCredit, segment_sql.credits_per_user(span.low, span.high)))
    assert sum(row[1] for row in by_key) == OrderCredit.objects.filter(order_id__range=(span.low, span.high)).count()

    # A rerun of the first day, with the four days after it written since: more credits to read than its span's
    # KEY_SCAN_ROWS_PER_CREDIT times over, so they are looked up by order id.
    first_day = Period.ending(date(2026, 11, 16))
    first_span = span_of(first_day)
    since_first_day = OrderCredit.objects.filter(created_at__gte=first_day.start - segments.CREDIT_KEY_MARGIN).count()
    assert since_first_day > segments.KEY_SCAN_ROWS_PER_CREDIT * (first_span.high - first_span.low + 1)
    assert segments.credits_scan_start(source, first_span, first_day) is None
    assert segments.credits_scan_start(source, segments.Span(0, -1), last_night) is None


def test_the_first_credit_key_since_an_instant():
    assert run(OrderCredit, segment_sql.credit_keys_since(START)) == [(None, None)]
