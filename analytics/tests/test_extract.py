"""Extract: two JDBC sources, one per service's database, and every read (window or look-up) sent to its own.

Under pytest the two aliases are two databases, each holding only its own service's tables, so a read sent to the
wrong source fails on a missing table instead of quietly reading the other side.
"""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connections
from django.utils import timezone
from pyspark.sql import functions as F

from analytics import extract, jdbc, segment_sql
from credits.models import DeadLetter
from demo.seed import seed_demo_data
from orders.models import Order

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]

DAY = timezone.now().date() - timedelta(days=1)
START = datetime(DAY.year, DAY.month, DAY.day, tzinfo=UTC)


def test_the_sources_are_the_two_services_databases():
    sources = jdbc.sources()
    assert (sources.orders.alias, sources.credits.alias) == ("default", "credits")
    assert sources.orders.url.split("?")[0].endswith("/" + connections["default"].settings_dict["NAME"])
    assert sources.credits.url.split("?")[0].endswith("/" + connections["credits"].settings_dict["NAME"])
    assert sources.orders.url != sources.credits.url


def test_a_replica_named_for_a_service_database_is_read_instead_of_it(settings):
    # Any alias stands in for a replica here: the orders database, as the credits database's "replica".
    settings.ANALYTICS_READ_DATABASES = {"credits": "default"}
    sources = jdbc.sources()
    assert (sources.orders.alias, sources.credits.alias) == ("default", "default")


def test_each_read_goes_to_the_database_that_holds_its_table(spark):
    seed_demo_data(orders=40, days=1, users=4, end=DAY, seed=8)
    order = Order.objects.order_by("id").first()
    now = timezone.now()
    letter = DeadLetter.objects.create(
        message_id="m-1",
        order_id=order.pk,
        payload={"order_id": order.pk},
        reason=DeadLetter.Reason.UNEXPECTED,
        error="planted",
        attempts=4,
        first_failed_at=now,
        last_failed_at=now,
    )
    sources = jdbc.sources()
    ids = list(Order.objects.order_by("id").values_list("id", flat=True))

    plan = extract.plan_window(sources, start=START - timedelta(hours=6), end=START + timedelta(days=1, hours=6))
    assert (plan.orders.rows, plan.logs.rows, plan.credits.rows) == (40, 40, 40)
    assert (plan.orders.lower, plan.orders.upper) == (ids[0], ids[-1])
    data = extract.extract_window(spark, sources, plan)
    assert (data.orders.count(), data.logs.count(), data.credits.count()) == (40, 40, 40)
    # DATETIME columns travel as integers (extract.MICROS_SUFFIX) and arrive as the same instants, to the microsecond.
    assert extract.ORDERS.timestamps == ("created_at",) and extract.CREDITS.timestamps == ("created_at", "ordered_at")
    read_at = {
        row.id: row.micros for row in data.orders.select("id", F.unix_micros("created_at").alias("micros")).collect()
    }
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    assert read_at == {
        pk: (at - epoch) // timedelta(microseconds=1) for pk, at in Order.objects.values_list("id", "created_at")
    }
    assert [row.id for row in data.dead_letters.collect()] == [letter.pk]

    # Look-ups read the rows of the ids in the ranges, wherever in time (ids 10..99 and 100.. are two lengths of text).
    wanted = [(ids[0], ids[2]), (ids[7], ids[12]), (ids[-1], ids[-1])]
    expected = sorted({i for low, high in wanted for i in ids if low <= i <= high})
    for table, source, column, key in (
        (extract.ORDERS, sources.orders, "id", "id"),
        (extract.LOGS, sources.orders, "foreign_key", "foreign_key"),
        (extract.CREDITS, sources.credits, "order_id", "order_id"),
    ):
        rows = extract.read_missing(spark, source, table, column=column, ranges=wanted).collect()
        assert sorted(int(row[key]) for row in rows) == expected, table.name


def test_reads_split_the_key_span_into_ranges_that_cover_every_key():
    assert extract._split(1, 100, 4) == ["26", "51", "76"]
    assert extract._split(1, 11, 2) == ["7"] and extract._split(5, 12, 4) == ["7", "9", "11"]
    assert extract._range_conditions("id", ["26", "51"]) == ["id < 26", "id >= 26 AND id < 51", "id >= 51"]
    assert extract._range_conditions("id", []) == ["1 = 1"]
    # Transaction ids: 32 hex digits, split as numbers and written back at the same width.
    low, high = f"{0x18F:032x}", f"{0x28F:032x}"
    assert extract._split(low, high, 2) == [f"'{0x210:032x}'"]
    assert extract._split("legacy-id", "other-id", 4) == []
    # Outbox foreign keys are text: a range of order ids is one text range per digit count.
    assert segment_sql.text_ranges("fk", 5, 123) == [
        "(fk BETWEEN '5' AND '9' AND CHAR_LENGTH(fk) = 1)",
        "(fk BETWEEN '10' AND '99' AND CHAR_LENGTH(fk) = 2)",
        "(fk BETWEEN '100' AND '123' AND CHAR_LENGTH(fk) = 3)",
    ]
