"""Repair makes messages due again through the outbox: what it resets, creates, and leaves alone."""

from datetime import timedelta

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from analytics.repair import repair
from credits.models import OrderCredit
from orders.services import order_create
from outbox.models import TransactionLog
from outbox.services import messages_retry_now

# Orders commit in their own transaction, as in production: no test case's transaction may hold them.
pytestmark = pytest.mark.usefixtures("committed_db")


@pytest.fixture
def orders(user):
    return [order_create(user=user, goods_name="tea", total=i + 1).order for i in range(5)]


def log_of(order) -> TransactionLog:
    return TransactionLog.objects.get(business="order", foreign_key=str(order.pk))


def test_republish_is_guarded_by_state_and_leaves_a_discard_alone(orders):
    later = timezone.now() + timedelta(hours=1)
    TransactionLog.objects.filter(id=orders[0].transaction_id).update(status="dead", attempts=9, next_attempt_at=later)
    TransactionLog.objects.filter(id=orders[1].transaction_id).update(status="discarded", discarded_by="ops")
    TransactionLog.objects.filter(id=orders[2].transaction_id).update(status="published", published_at=later)
    ids = [orders[0].transaction_id, orders[1].transaction_id, orders[2].transaction_id, "nope"]
    assert messages_retry_now(ids=ids, republish=True) == 2
    first, second, third = log_of(orders[0]), log_of(orders[1]), log_of(orders[2])
    assert (first.status, first.attempts) == ("pending", 0)
    assert first.next_attempt_at <= timezone.now()
    assert second.status == "discarded"
    assert third.status == "pending"


def test_repair_has_no_retry_of_its_own():
    """One messages_retry_now, the outbox's: repair calls it, with its wake-up, instead of keeping a copy."""
    import analytics.repair

    assert analytics.repair.messages_retry_now is messages_retry_now


def test_repair_resets_rows_creates_missing_messages_and_explains_the_rest(orders):
    published, unlogged, credited, discarded, stuck = orders
    TransactionLog.objects.filter(id=published.transaction_id).update(status="published", published_at=timezone.now())
    log_of(unlogged).delete()
    OrderCredit.objects.create(user_id=credited.user_id, order_id=credited.pk, amount=2 * credited.total)
    TransactionLog.objects.filter(id=discarded.transaction_id).update(status="discarded", discarded_by="ops")
    TransactionLog.objects.filter(id=stuck.transaction_id).update(status="dead")

    result = repair(
        missing_credit_order_ids=[published.pk, unlogged.pk, credited.pk, discarded.pk, 999_999],
        stuck_log_ids=[stuck.transaction_id, published.transaction_id],
    )
    assert result.reset == sorted([published.transaction_id, stuck.transaction_id])
    assert result.created == [unlogged.transaction_id]
    assert result.skipped == {
        str(credited.pk): "credited since the check ran",
        str(discarded.pk): f"its message {discarded.transaction_id} was discarded by ops",
        "999999": "order no longer exists",
    }
    created = log_of(unlogged)
    assert created.payload == {
        "schema_version": 1,
        "transaction_id": unlogged.transaction_id,
        "order_id": unlogged.pk,
        "user_id": unlogged.user_id,
        "total": unlogged.total,
    }
    assert created.status == "pending"
    assert result.reenqueued == 3
    # Never a credit: awarding is the consumer's job.
    assert OrderCredit.objects.count() == 1


def test_a_stuck_row_published_meanwhile_is_left_alone(orders):
    row = orders[0].transaction_id
    TransactionLog.objects.filter(id=row).update(status="published", published_at=timezone.now())
    result = repair(missing_credit_order_ids=[], stuck_log_ids=[row])
    assert result.reset == [] and result.skipped == {row: "published or discarded since the check ran"}
    assert log_of(orders[0]).status == "published"


def test_repair_only_reads_the_credits_database_and_writes_the_outbox(orders):
    credited, missing, stuck = orders[:3]
    OrderCredit.objects.create(user_id=credited.user_id, order_id=credited.pk, amount=2 * credited.total)
    TransactionLog.objects.filter(id=stuck.transaction_id).update(status="dead")
    with (
        CaptureQueriesContext(connections["credits"]) as on_credits,
        CaptureQueriesContext(connections["default"]) as on_orders,
    ):
        result = repair(missing_credit_order_ids=[credited.pk, missing.pk], stuck_log_ids=[stuck.transaction_id])
    assert result.reset == sorted([missing.transaction_id, stuck.transaction_id])
    # One question to the credits database (which of these orders were credited since?), and nothing written there.
    assert [q["sql"].split()[0] for q in on_credits.captured_queries] == ["SELECT"]
    assert any(q["sql"].startswith("UPDATE `transaction_log`") for q in on_orders.captured_queries)
    assert OrderCredit.objects.count() == 1


def test_a_message_repair_creates_is_in_the_version_the_order_service_writes(orders, settings):
    settings.ORDER_MESSAGE_VERSION = 2
    order = orders[0]
    log_of(order).delete()
    assert repair(missing_credit_order_ids=[order.pk], stuck_log_ids=[]).created == [order.transaction_id]
    payload = log_of(order).payload
    assert payload["schema_version"] == 2
    assert payload["ordered_at"] == order.created_at.isoformat()
