"""Reads for credits: a user's balance and entries, an order's credit status, and open dead letters."""

from django.db.models import Case, Exists, OuterRef, QuerySet, Value, When

from credits.models import CreditBalance, DeadLetter, OrderCredit


class CreditStatus:
    PENDING = "pending"
    AWARDED = "awarded"
    DEAD_LETTERED = "dead_lettered"


def credit_status_expression():
    """Return a SQL expression giving an order row's credit status, for annotating order querysets.

    A credit row wins over an open dead letter: the credits were given (say a second copy of the message failed),
    and the admin still lists that dead letter for an operator to close.
    """
    return Case(
        When(Exists(OrderCredit.objects.filter(order_id=OuterRef("pk"))), then=Value(CreditStatus.AWARDED)),
        When(
            Exists(DeadLetter.objects.filter(order_id=OuterRef("pk"), status=DeadLetter.Status.OPEN)),
            then=Value(CreditStatus.DEAD_LETTERED),
        ),
        default=Value(CreditStatus.PENDING),
    )


def credit_entries(*, user) -> QuerySet[OrderCredit]:
    """Return the user's credit entries, newest first."""
    return OrderCredit.objects.filter(user=user).order_by("-id")


def credit_balance(*, user) -> int:
    """Return the user's credit balance, kept by the award service in the same transaction as each entry."""
    return CreditBalance.objects.filter(user=user).values_list("balance", flat=True).first() or 0


def dead_letters_open_count() -> int:
    """Return how many dead letters wait for an operator."""
    return DeadLetter.objects.filter(status=DeadLetter.Status.OPEN).count()
