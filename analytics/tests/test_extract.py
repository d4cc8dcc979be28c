"""Extract: two JDBC sources, one per service's database, and every read (window or look-up) sent to its own.

Under pytest the two aliases are two databases, each holding only its own service's tables, so a read sent to the
wrong source fails on a missing table instead of quietly reading the other side.
"""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connections
from django.utils import timezone

from analytics import extract
from credits.models import DeadLetter, OrderCredit
from demo.seed import seed_demo_data
from orders.models import Order

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]

DAY = timezone.now().date() - timedelta(days=1)
START = datetime(DAY.year, DAY.month, DAY.day, tzinfo=UTC)


def test_the_sources_are_the_two_services_databases():
    sources = extract.sources()
    assert (sources.orders.alias, sources.credits.alias) == ("default", "credits")
    assert sources.orders.url.split("?")[0].endswith("/" + connections["default"].settings_dict["NAME"])
    assert sources.credits.url.split("?")[0].endswith("/" + connections["credits"].settings_dict["NAME"])
    assert sources.orders.url != sources.credits.url


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
    sources = extract.sources()
    ids = list(Order.objects.order_by("id").values_list("id", flat=True)[:5])

    data = extract.extract_window(
        spark, sources, start=START - timedelta(hours=6), end=START + timedelta(days=1, hours=6)
    )
    assert (data.orders.count(), data.logs.count(), data.credits.count()) == (40, 40, 40)
    assert [row.id for row in data.dead_letters.collect()] == [letter.pk] and data.dead_letters_note == ""
    assert sorted(r.id for r in extract.read_orders_by_id(spark, sources, ids).collect()) == ids
    assert sorted(r.order_id for r in extract.read_logs_by_order_id(spark, sources, ids).collect()) == ids
    credits = extract.read_credits_by_order_id(spark, sources, ids).collect()
    assert sorted(r.id for r in credits) == sorted(
        OrderCredit.objects.filter(order_id__in=ids).values_list("id", flat=True)
    )
    assert extract.count_orders(sources.orders, start=START, end=START + timedelta(days=1)) == 40
