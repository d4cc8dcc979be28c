"""The order message each ORDER_MESSAGE_VERSION writes, read back from the outbox row written with the order."""

from datetime import datetime

import pytest

from orders.services import order_create
from outbox.models import TransactionLog

# Orders commit in their own transaction, as in production: no test case's transaction may hold them.
pytestmark = pytest.mark.usefixtures("committed_db")


def message_of(order):
    return TransactionLog.objects.get(pk=order.transaction_id).payload


def test_version_1_is_written_by_default(user):
    order = order_create(user=user, goods_name="book", total=3).order
    assert message_of(order) == {
        "schema_version": 1,
        "transaction_id": order.transaction_id,
        "order_id": order.pk,
        "user_id": user.pk,
        "total": 3,
    }


def test_version_2_adds_when_the_order_was_placed_and_changes_nothing_else(user, settings):
    settings.ORDER_MESSAGE_VERSION = 2
    order = order_create(user=user, goods_name="book", total=3).order
    payload = message_of(order)
    stored = type(order).objects.get(pk=order.pk)
    assert payload == {
        "schema_version": 2,
        "transaction_id": order.transaction_id,
        "order_id": order.pk,
        "user_id": user.pk,
        "total": 3,
        "ordered_at": payload["ordered_at"],
    }
    assert datetime.fromisoformat(payload["ordered_at"]) == stored.created_at
    assert payload["ordered_at"].endswith("+00:00")
