"""Reads for orders: a user's own orders, and the check-back of a local transaction."""

import re

from django.db.models import QuerySet

from credits.selectors import CreditStatus, credit_status_expression
from orders.models import Order
from orders.services import BUSINESS_ORDER

CREDIT_PENDING = CreditStatus.PENDING
TRANSACTION_ID = re.compile(r"[0-9a-f]{32}")


def order_list(*, user) -> QuerySet[Order]:
    """Return the user's orders, newest first, each annotated with its credit status."""
    return Order.objects.filter(user=user).annotate(credit_status=credit_status_expression()).order_by("-id")


def order_get(*, user, order_id: int) -> Order | None:
    """Return the user's order with that id, or None when it does not exist or belongs to someone else."""
    return order_list(user=user).filter(pk=order_id).first()


def order_credit_status(*, order: Order) -> str:
    """Return the credit status of one order."""
    return Order.objects.filter(pk=order.pk).annotate(s=credit_status_expression()).values_list("s", flat=True)[0]


def transaction_check(*, user, transaction_id: str) -> dict | None:
    """Return the committed transaction behind a message, or None when it is unknown or not the caller's.

    The order row keeps its transaction id for good, so the answer outlives the transaction_log row that
    retention deletes after publishing.
    """
    if not TRANSACTION_ID.fullmatch(transaction_id):
        return None
    order = Order.objects.filter(transaction_id=transaction_id).only("id", "user_id").first()
    if order is None or not (user.is_staff or order.user_id == user.pk):
        return None
    return {
        "transaction_id": transaction_id,
        "business": BUSINESS_ORDER,
        "foreign_key": str(order.pk),
        "state": "COMMITTED",
    }
