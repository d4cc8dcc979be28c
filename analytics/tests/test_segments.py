"""Aggregates computed in each database: faults a count and a sum would miss are found, with exact ids, and the
random audit catches a checksum that no longer says what its rows hold.

The rows are committed (transactional tests): the nightly command reads them over its own JDBC connections, from
the two test databases.
"""

import json
import re
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connections, router
from django.utils import timezone

from analytics import jdbc, segment_sql, segments
from analytics.period import Period
from credits.models import OrderCredit
from demo.plant import plant_inconsistencies
from demo.seed import seed_demo_data
from orders.models import Order
from outbox.models import TransactionLog

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]

DAY = timezone.now().date() - timedelta(days=2)


@pytest.fixture
def day(spark):
    """A consistent day: 200 orders of 10 users, with their published outbox rows and dated credits."""
    return seed_demo_data(orders=200, days=1, users=10, end=DAY, seed=3)


def add_user_orders(user_id: int, totals: list[int], *, base: int) -> list[int]:
    """Add orders with ids base+1.. of one user on DAY, each with its published outbox row and its credit."""
    at = Period.ending(DAY).start + timedelta(hours=20)
    get_user_model().objects.get_or_create(id=user_id, defaults={"username": f"segments-{user_id}"})
    ids = []
    for i, total in enumerate(totals, start=1):
        order_id = base + i
        created = at + timedelta(seconds=i)
        tx = f"{order_id:032x}"
        Order.objects.create(
            id=order_id, user_id=user_id, goods_name="g", total=total, transaction_id=tx, created_at=created
        )
        TransactionLog.objects.create(
            id=tx, business="order", foreign_key=str(order_id), payload={}, status="published", created_at=created
        )
        OrderCredit.objects.create(
            user_id=user_id,
            order_id=order_id,
            amount=2 * total,
            transaction_id=tx,
            created_at=created + timedelta(seconds=1),
            ordered_at=created,
        )
        ids.append(order_id)
    return ids


def plant_what_a_count_and_a_sum_miss(base: int) -> dict[str, list]:
    """For one user, a missing credit pair and an orphan credit pair whose order ids, counts and amounts all sum
    alike; for another, amounts swapped between two of its orders' credits."""
    a, b, c, d = add_user_orders(9001, [5, 5, 5, 5], base=base)
    OrderCredit.objects.filter(order_id__in=[a, d]).delete()
    TransactionLog.objects.filter(foreign_key__in=[str(b), str(c)]).delete()
    Order.objects.filter(id__in=[b, c]).delete()
    e, f = add_user_orders(9002, [3, 7], base=base + 10)
    OrderCredit.objects.filter(order_id=e).update(amount=14)
    OrderCredit.objects.filter(order_id=f).update(amount=6)
    credit_ids = dict(OrderCredit.objects.values_list("order_id", "id"))
    return {
        "missing_credit": [a, d],
        "orphan_credit": sorted([credit_ids[b], credit_ids[c]]),
        "credit_amount_mismatch": sorted([credit_ids[e], credit_ids[f]]),
    }


def run_nightly() -> str:
    out = StringIO()
    call_command("run_nightly_reports", "--date", str(DAY), stdout=out)
    return out.getvalue()


def found(reports) -> dict[str, tuple[int, list]]:
    checks = json.loads((reports / DAY.isoformat() / "consistency.json").read_text())["checks"]
    return {name: (check["count"], check["sample"]) for name, check in checks.items() if check["count"]}


def per_user(sql: str, alias: str) -> dict[int, tuple]:
    """Per user: count, amount and checksum (its days' hash sums, sent in base 36, added and reduced)."""
    totals: dict[int, tuple] = {}
    with connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT user_id, `rows`, amount, checksum FROM ({sql}) AS t")  # noqa: S608
        for user, rows, amount, checksum in cursor.fetchall():
            before = totals.get(user, (0, 0, 0))
            hashes = (before[2] + int(checksum, segment_sql.HASH_BASE)) % segment_sql.HASH_MODULUS
            totals[user] = (before[0] + rows, before[1] + amount, hashes)
    return totals


def test_faults_a_count_and_a_sum_would_miss_are_found_with_exact_ids(reports, day):
    base = Order.objects.order_by("-id").values_list("id", flat=True).first() + 100
    expected = plant_what_a_count_and_a_sum_miss(base)

    # What the databases compute for those users: counts and amounts agree, only the hash sums tell them apart.
    span = (Order.objects.order_by("id").first().id, base + 20)
    orders = per_user(segment_sql.orders_per_user(*span), router.db_for_read(Order))
    credits = per_user(segment_sql.credits_per_user(*span), router.db_for_read(OrderCredit))
    for user in (9001, 9002):
        assert orders[user][:2] == credits[user][:2]
        assert orders[user][2] != credits[user][2]

    # And a user whose credits were all written before ordered_at existed: compared on count, amount and checksum
    # alone, and audited like the others, its missing instants left out of both sides' `dated` hash.
    legacy = OrderCredit.objects.exclude(user_id__in=(9001, 9002)).values_list("user_id", flat=True).first()
    assert OrderCredit.objects.filter(user_id=legacy).update(ordered_at=None) > 1

    output = run_nightly()

    assert found(reports) == {name: (len(ids), ids) for name, ids in expected.items()}
    # Only the two users whose sums disagree were fetched besides the audit's (all 12 users here), and every
    # audited user's sums, recomputed from its rows, are the databases'.
    assert "users=12" in output and "audit_mismatches=0" in output


def test_every_planted_fault_is_found_and_a_balanced_day_fetches_only_the_audit(reports, day, settings):
    settings.ANALYTICS_AUDIT_USERS = 5
    balanced = run_nightly()
    assert found(reports) == {}
    assert "audited=5, users_fetched=5" in balanced and "leaves=0" in balanced
    # The audited users' orders came with their outbox rows and credits: the look-ups, which would otherwise read
    # those and run the checks again, found nothing to add.
    counts = re.findall(r"(orders|credits|logs)_fetched=(\d+(?:,\d{3})*)", balanced)
    fetched = {name: int(count.replace(",", "")) for name, count in counts}
    assert fetched["orders"] > 0 and fetched["logs"] == fetched["orders"] == fetched["credits"]
    assert "order_found=0, credit_found=0, log_found=0" in balanced
    # The audited users' sums, recomputed from their rows in Spark, are those the databases sent (reduced alike).
    assert "audit_mismatches=0" in balanced

    expected = plant_inconsistencies(day=DAY, per_kind=2, seed=8)
    planted = run_nightly()
    assert found(reports) == {name: (len(ids), ids) for name, ids in expected.items() if ids}
    assert "users_fetched=5," not in planted and "leaves=0" not in planted
    # So did the orders of the users and leaves that disagree.
    assert "order_found=0, credit_found=0, log_found=0" in planted


def swap_two_credits_of_one_user() -> list[int]:
    """Swap the amounts of two credits of one user whose amounts differ; return the two credit ids."""
    credits = OrderCredit.objects.order_by("user_id", "id").values_list("user_id", "id", "amount")
    by_user: dict[int, list] = {}
    for user_id, credit_id, amount in credits:
        by_user.setdefault(user_id, []).append((credit_id, amount))
    for pairs in by_user.values():
        first = pairs[0]
        other = next((p for p in pairs[1:] if p[1] != first[1]), None)
        if other:
            OrderCredit.objects.filter(id=first[0]).update(amount=other[1])
            OrderCredit.objects.filter(id=other[0]).update(amount=first[1])
            return sorted([first[0], other[0]])
    raise AssertionError("no user with two credits of different amounts")


@pytest.mark.parametrize("audited", [0, 100])
def test_the_audit_catches_a_checksum_that_disagrees_with_its_rows(reports, day, settings, monkeypatch, audited):
    # The fault injected: a hash the databases compute as a constant, so every user's sums agree whatever its rows.
    monkeypatch.setattr(segment_sql, "row_hash", lambda text: "0")
    settings.ANALYTICS_AUDIT_USERS = audited
    swapped = swap_two_credits_of_one_user()

    output = run_nightly()

    if audited:
        # Audited row by row, the user's credits are checked and their sums recomputed: both disagree.
        assert found(reports) == {"credit_amount_mismatch": (2, swapped)}
        assert "audit_mismatches=0" not in output and "audit_mismatches=" in output
    else:
        # Without the audit, the broken checksum hides the swap: what the audit is for.
        assert found(reports) == {}


def test_the_outbox_ranges_bisect_level_by_level_down_to_the_leaves_that_hold_the_differences(spark, day):
    """Small leaves and few first-level buckets, so a day of 200 orders takes every level: the leaves returned are
    those holding an order without its outbox row and an outbox row without its order, and no other."""
    ids = sorted(Order.objects.values_list("id", flat=True))
    span = segments.Span(ids[0], ids[-1])
    without_row, without_order = ids[37], ids[150]
    TransactionLog.objects.filter(foreign_key=str(without_row)).delete()
    Order.objects.filter(id=without_order).delete()
    facts: dict = {}

    leaves = segments.bisect_outbox(spark, jdbc.sources().orders, span, facts, leaf=4, first_level=1)

    assert all(high - low < 4 for low, high in leaves) and len(leaves) == 2
    assert [any(low <= i <= high for low, high in leaves) for i in (without_row, without_order)] == [True, True]
    levels = facts["outbox_levels"]
    assert levels >= 3
    assert [facts[f"outbox_level{n}_width"] for n in range(1, levels + 1)] == [
        4 * segments.FANOUT ** (levels - n) for n in range(1, levels + 1)
    ]
    assert facts[f"outbox_level{levels}_differing"] == 2
