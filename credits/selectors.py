"""Reads for credits: a user's balance and entries, and an order's credit status."""

from django.db.models import Case, Exists, OuterRef, QuerySet, Sum, Value, When

from credits.models import OrderCredit


class CreditStatus:
    PENDING = "pending"
    AWARDED = "awarded"
    DEAD_LETTERED = "dead_lettered"


def credit_status_expression():
    """Return a SQL expression giving an order row's credit status, for annotating order querysets."""
    return Case(
        When(Exists(OrderCredit.objects.filter(order_id=OuterRef("pk"))), then=Value(CreditStatus.AWARDED)),
        default=Value(CreditStatus.PENDING),
    )


def credit_entries(*, user) -> QuerySet[OrderCredit]:
    """Return the user's credit entries, newest first."""
    return OrderCredit.objects.filter(user=user).order_by("-id")


def credit_balance(*, user) -> int:
    """Return the user's credit balance."""
    return OrderCredit.objects.filter(user=user).aggregate(balance=Sum("total"))["balance"] or 0
