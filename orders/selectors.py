"""Reads for orders: a user's own orders with their credit status, and the check-back of a local transaction.

Orders come from the order service's database; their credit status from the credits service's, in a separate query
per page (never a join across the two).
"""

from collections.abc import Sequence

from django.db.models import QuerySet

from core.contract import BUSINESS_ORDER, TRANSACTION_ID
from credits.selectors import CreditStatus, credit_statuses
from orders.models import Order

CREDIT_PENDING = CreditStatus.PENDING


def order_list(*, user) -> QuerySet[Order]:
    """Return the user's orders, newest first; give a page of them to orders_with_credit_status."""
    return Order.objects.filter(user=user).order_by("-id")


def orders_with_credit_status(orders: Sequence[Order]) -> Sequence[Order]:
    """Set `credit_status` on each of these orders (one query on the credits database) and return them."""
    statuses = credit_statuses(order_ids=[order.pk for order in orders])
    for order in orders:
        order.credit_status = statuses[order.pk]
    return orders


def order_get(*, user, order_id: int) -> Order | None:
    """Return the user's order with that id and its credit status, or None when it is missing or someone else's."""
    order = order_list(user=user).filter(pk=order_id).first()
    return None if order is None else orders_with_credit_status([order])[0]


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
