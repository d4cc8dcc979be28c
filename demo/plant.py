"""Plant inconsistencies in a seeded day: break a few orders in every way the nightly checks detect.

Each side is changed in its own database (orders and outbox rows in the order service's, credits in the credits
service's), and the function returns the ids each check must report, for the tests, the bench and the demo.
"""

import random
from datetime import UTC, date, datetime, timedelta

from django.db import models, router, transaction
from django.db.models import Max, Min

from core.contract import BUSINESS_ORDER
from credits.models import OrderCredit
from orders.models import Order
from outbox.models import TransactionLog

# Order ids drawn per round when looking for credited orders of the day (a few rounds, whatever the day's size).
SAMPLE_ROUND = 200
# Each kind of inconsistency, and the id the nightly checks report for it (see analytics/checks.py).
PLANTABLE = (
    "order_without_log",
    "log_without_order",
    "missing_credit",
    "credit_amount_mismatch",
    "credit_ordered_at_mismatch",
    "orphan_credit",
    "stuck_outbox",
)


def plant_inconsistencies(*, day: date, per_kind: int = 3, seed: int | None = None) -> dict[str, list]:
    """Break `per_kind` consistent orders of `day` in each plantable way; return what the checks must report.

    duplicate_credit cannot be planted while order_credits.order_id is UNIQUE, and dead_letters_open belongs to
    the credits consumer's table, so both are expected empty here. Each side is changed in its own database, in
    one transaction per database, committed together at the end.
    """
    rng = random.Random(seed)
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    needed = per_kind * len(PLANTABLE)
    candidates = _credited_orders_sample(rng=rng, start=start, end=start + timedelta(days=1), count=needed)
    if len(candidates) < needed:
        raise ValueError(f"{day} has {len(candidates)} credited orders; planting needs {needed}")
    picked = rng.sample(sorted(candidates.items()), needed)
    groups = {kind: sorted(picked[i * per_kind : (i + 1) * per_kind]) for i, kind in enumerate(PLANTABLE)}

    def order_ids(kind: str) -> list[int]:
        return [order_id for order_id, _ in groups[kind]]

    def log_ids(kind: str) -> list[str]:
        return [tx for _, tx in groups[kind]]

    def logs_of(ids: list[int]):
        return TransactionLog.objects.filter(business=BUSINESS_ORDER, foreign_key__in=[str(i) for i in ids])

    expected: dict[str, list] = {"duplicate_credit": [], "dead_letters_open": []}
    with (
        transaction.atomic(using=router.db_for_write(Order)),
        transaction.atomic(using=router.db_for_write(OrderCredit)),
    ):
        logs_of(order_ids("order_without_log")).delete()
        expected["order_without_log"] = order_ids("order_without_log")

        OrderCredit.objects.filter(order_id__in=order_ids("log_without_order")).delete()
        Order.objects.filter(id__in=order_ids("log_without_order")).delete()
        expected["log_without_order"] = sorted(log_ids("log_without_order"))

        # The message was published but the credit never came: lost between broker and consumer.
        OrderCredit.objects.filter(order_id__in=order_ids("missing_credit")).delete()

        credits = OrderCredit.objects.filter(order_id__in=order_ids("credit_amount_mismatch"))
        expected["credit_amount_mismatch"] = sorted(credits.values_list("id", flat=True))
        credits.update(amount=models.F("amount") + 1)

        # Dated by a version-2 message an hour before its order was placed: a producer sent some other time.
        misdated = OrderCredit.objects.filter(order_id__in=order_ids("credit_ordered_at_mismatch"))
        expected["credit_ordered_at_mismatch"] = sorted(misdated.values_list("id", flat=True))
        for order_id, created_at in Order.objects.filter(id__in=order_ids("credit_ordered_at_mismatch")).values_list(
            "id", "created_at"
        ):
            misdated.filter(order_id=order_id).update(ordered_at=created_at - timedelta(hours=1))

        orphans = OrderCredit.objects.filter(order_id__in=order_ids("orphan_credit"))
        expected["orphan_credit"] = sorted(orphans.values_list("id", flat=True))
        logs_of(order_ids("orphan_credit")).delete()
        Order.objects.filter(id__in=order_ids("orphan_credit")).delete()

        # Never published (the relay is failing), so never credited; the last one gave up and is dead.
        stuck = order_ids("stuck_outbox")
        OrderCredit.objects.filter(order_id__in=stuck).delete()
        logs_of(stuck[:-1]).update(
            status=TransactionLog.Status.PENDING,
            attempts=3,
            published_at=None,
            next_attempt_at=models.F("created_at") + timedelta(minutes=5),
            last_error="planted: broker unreachable",
        )
        logs_of(stuck[-1:]).update(
            status=TransactionLog.Status.DEAD,
            published_at=None,
            attempts=10,
            last_error="planted: gave up after 10 attempts",
        )
        expected["stuck_outbox"] = sorted(log_ids("stuck_outbox"))
        expected["missing_credit"] = sorted(order_ids("missing_credit") + stuck)
    return expected


def _credited_orders_sample(*, rng: random.Random, start: datetime, end: datetime, count: int) -> dict[int, str]:
    """Return at least `count` orders placed in [start, end) that have a credit (id -> transaction id), or all of them
    if there are fewer.

    Ids are drawn at random between the window's smallest and largest order id, a round at a time, so a day of 10M
    orders costs a few small queries, not a 10M-row read. Orders are in one database, credits in the other: each
    round reads its orders from the first, then which of them have a credit from the second.
    """
    in_window = Order.objects.filter(created_at__gte=start, created_at__lt=end)
    bounds = in_window.aggregate(low=Min("id"), high=Max("id"))
    if bounds["low"] is None:
        return {}
    untried = range(bounds["low"], bounds["high"] + 1)
    tried: set[int] = set()
    found: dict[int, str] = {}
    while len(found) < count and len(tried) < len(untried):
        if len(untried) - len(tried) <= SAMPLE_ROUND:
            ids = [i for i in untried if i not in tried]
        else:
            ids = [i for i in rng.sample(untried, SAMPLE_ROUND) if i not in tried]
        tried.update(ids)
        orders = dict(in_window.filter(id__in=ids).values_list("id", "transaction_id"))
        credited = OrderCredit.objects.filter(order_id__in=list(orders)).values_list("order_id", flat=True)
        found.update((order_id, orders[order_id]) for order_id in credited)
    return found
