"""seed_demo_data: a consistent history in both services' databases, fast, and planting exactly what it says."""

from datetime import date, timedelta

import pytest
from django.core.management import call_command
from django.db import connections
from django.db.models import Max, Min, Sum

from credits.models import CreditBalance, OrderCredit
from demo.plant import plant_inconsistencies
from demo.seed import seed_demo_data
from orders.models import Order
from outbox.models import TransactionLog

pytestmark = pytest.mark.django_db(transaction=True)

END = date(2026, 11, 20)


def test_seed_writes_orders_published_logs_and_matching_credits():
    result = seed_demo_data(orders=2_000, days=4, users=50, end=END, seed=3, batch_orders=300)
    assert (result.orders, result.users, result.rows) == (2_000, 50, 6_000)
    assert Order.objects.count() == TransactionLog.objects.count() == OrderCredit.objects.count() == 2_000
    span = Order.objects.aggregate(first=Min("created_at"), last=Max("created_at"))
    assert span["first"].date() == date(2026, 11, 17) and span["last"].date() == END
    # Ids follow time, so the nightly job's id-partitioned reads and MIN(id) "first order" hold.
    by_time = list(Order.objects.order_by("created_at", "id").values_list("id", flat=True))
    assert by_time == sorted(by_time)
    # Orders and credits are in two databases: compare them side by side in Python, as the nightly job does.
    orders = {o.pk: o for o in Order.objects.all()}
    for credit in OrderCredit.objects.all():
        order = orders[credit.order_id]
        assert (credit.user_id, credit.amount, credit.transaction_id) == (
            order.user_id,
            2 * order.total,
            order.transaction_id,
        )
        assert credit.created_at >= order.created_at
    assert set(TransactionLog.objects.values_list("status", flat=True)) == {"published"}
    order = Order.objects.order_by("?").first()
    log = TransactionLog.objects.get(business="order", foreign_key=str(order.pk))
    assert log.id == order.transaction_id and log.created_at == order.created_at
    assert log.payload == {
        "schema_version": 1,
        "transaction_id": order.transaction_id,
        "order_id": order.pk,
        "user_id": order.user_id,
        "total": order.total,
    }


def test_each_table_is_written_to_its_own_services_database():
    seed_demo_data(orders=50, days=1, users=5, end=END, seed=2)

    def rows(alias: str, table: str) -> int | None:
        connection = connections[alias]
        with connection.cursor() as cursor:
            if table not in connection.introspection.table_names(cursor):
                return None
            cursor.execute(f"SELECT COUNT(*) FROM {table}")  # noqa: S608 (the test's own table names)
            return cursor.fetchone()[0]

    # Under pytest the two aliases are two databases; each holds only its own service's tables.
    assert connections["default"].settings_dict["NAME"] != connections["credits"].settings_dict["NAME"]
    assert [rows("default", t) for t in ("orders", "transaction_log", "order_credits", "credit_balances")] == [
        50,
        50,
        None,
        None,
    ]
    assert [rows("credits", t) for t in ("orders", "transaction_log", "order_credits")] == [None, None, 50]
    assert rows("credits", "credit_balances") == 5


def test_seeding_twice_appends_after_the_existing_ids():
    seed_demo_data(orders=100, days=1, users=5, end=END, seed=1)
    second = seed_demo_data(orders=100, days=1, users=5, end=END, seed=2)
    assert (second.first_order_id, second.last_order_id) == (101, 200)
    assert OrderCredit.objects.count() == 200


def test_seeded_balances_equal_the_sum_of_credits():
    seed_demo_data(orders=300, days=2, users=7, end=END, seed=4)
    seed_demo_data(orders=200, days=2, users=7, end=END, seed=5)

    sums = dict(OrderCredit.objects.values("user_id").annotate(s=Sum("amount")).values_list("user_id", "s"))
    balances = dict(CreditBalance.objects.values_list("user_id", "balance"))
    assert sums and balances == sums


def test_plant_returns_what_it_broke():
    seed_demo_data(orders=200, days=1, users=10, end=END, seed=4)
    planted = plant_inconsistencies(day=END, per_kind=2, seed=4)
    assert len(planted["order_without_log"]) == 2 and len(planted["missing_credit"]) == 4
    assert not TransactionLog.objects.filter(foreign_key__in=[str(i) for i in planted["order_without_log"]]).exists()
    assert (
        not Order.objects.filter(transaction_id__in=planted["log_without_order"]).exists()
        and TransactionLog.objects.filter(id__in=planted["log_without_order"]).count() == 2
    )
    assert not OrderCredit.objects.filter(order_id__in=planted["missing_credit"]).exists()
    # The credit side of the cross-database faults: a credit whose order is gone, a credit that disagrees with it.
    orphans = OrderCredit.objects.filter(id__in=planted["orphan_credit"])
    orphan_orders = list(orphans.values_list("order_id", flat=True))
    assert len(orphan_orders) == 2 and not Order.objects.filter(id__in=orphan_orders).exists()
    mismatched = OrderCredit.objects.filter(id__in=planted["credit_amount_mismatch"])
    totals = dict(Order.objects.filter(id__in=[c.order_id for c in mismatched]).values_list("id", "total"))
    assert sorted(c.amount - 2 * totals[c.order_id] for c in mismatched) == [1, 1]
    misdated = OrderCredit.objects.filter(id__in=planted["credit_ordered_at_mismatch"])
    placed = dict(Order.objects.filter(id__in=[c.order_id for c in misdated]).values_list("id", "created_at"))
    assert [placed[c.order_id] - c.ordered_at for c in misdated] == [timedelta(hours=1)] * 2
    assert set(TransactionLog.objects.filter(id__in=planted["stuck_outbox"]).values_list("status", flat=True)) == {
        "pending",
        "dead",
    }
    assert planted["duplicate_credit"] == [] and planted["dead_letters_open"] == []


def test_command_prints_rate_and_plants(capsys):
    call_command("seed_demo_data", "--orders", "300", "--days", "2", "--users", "7", "--end", "2026-11-20", "--plant")
    out = capsys.readouterr().out
    assert "loaded 300 orders for 7 users over 2 days ending 2026-11-20" in out
    assert "rows/s" in out
    assert "missing_credit: [" in out and "duplicate_credit: []  (not plantable here" in out


def test_plant_refuses_a_day_with_too_few_credited_orders():
    seed_demo_data(orders=30, days=1, users=3, end=END, seed=6)
    OrderCredit.objects.filter(order_id__gt=15).delete()
    with pytest.raises(ValueError, match="has 15 credited orders; planting needs 21"):
        plant_inconsistencies(day=END, per_kind=3, seed=6)
