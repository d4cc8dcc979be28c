"""Reads for credits: a user's balance and entries, the credit status of orders, open dead letters, and the messages
waiting in each version's queue on the broker."""

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from amqp.exceptions import ChannelError
from django.conf import settings
from django.db import DatabaseError
from django.db.models import QuerySet, Value
from kombu import Connection

from core.broker import connection_ensure
from core.contract import SCHEMA_VERSIONS, credits_queue_name
from core.minutes import Minutes, counts_per_minute
from credits.models import CreditBalance, DeadLetter, OrderCredit

logger = logging.getLogger(__name__)

# A scrape reads the version queues from the broker: a broker that does not answer must not hold it up for long.
BROKER_READ_TIMEOUT_SECONDS = 2.0


class CreditStatus:
    PENDING = "pending"
    AWARDED = "awarded"
    DEAD_LETTERED = "dead_lettered"
    # The credits database could not be asked; the order itself is fine.
    UNKNOWN = "unknown"


def credit_statuses(*, order_ids: Iterable[int]) -> dict[int, str]:
    """Return the credit status of each of these orders, in one query on the credits database.

    A credit row wins over an open dead letter: the credits were given (say a second copy of the message failed),
    and the admin still lists that dead letter for an operator to close. When the credits database does not answer,
    every status is UNKNOWN: the orders are still served.
    """
    order_ids = list(order_ids)
    if not order_ids:
        return {}
    awarded = OrderCredit.objects.filter(order_id__in=order_ids).values_list("order_id", Value(CreditStatus.AWARDED))
    dead = DeadLetter.objects.filter(order_id__in=order_ids, status=DeadLetter.Status.OPEN).values_list(
        "order_id", Value(CreditStatus.DEAD_LETTERED)
    )
    statuses = dict.fromkeys(order_ids, CreditStatus.PENDING)
    try:
        rows = list(dead.union(awarded, all=True))
    except DatabaseError as exc:
        logger.warning(
            "credit status unknown for %d order(s): the credits database did not answer: %s", len(statuses), exc
        )
        return dict.fromkeys(order_ids, CreditStatus.UNKNOWN)
    for order_id, status in rows:
        if statuses[order_id] != CreditStatus.AWARDED:
            statuses[order_id] = status
    return statuses


def credit_entries(*, user_id: int) -> QuerySet[OrderCredit]:
    """Return the user's credit entries, newest first."""
    return OrderCredit.objects.filter(user_id=user_id).order_by("-id")


def credit_balance(*, user_id: int) -> int:
    """Return the user's credit balance, kept by the award service in the same transaction as each entry."""
    return CreditBalance.objects.filter(user_id=user_id).values_list("balance", flat=True).first() or 0


def dead_letters_open_count() -> int:
    """Return how many dead letters wait for an operator."""
    return DeadLetter.objects.filter(status=DeadLetter.Status.OPEN).count()


def credits_per_minute(*, minutes: Minutes) -> list[int]:
    """Return how many credits were awarded in each minute, oldest first."""
    return counts_per_minute(OrderCredit.objects.all(), field="created_at", minutes=minutes)


def credit_award_times(*, since: datetime, limit: int) -> list[tuple[int, datetime]]:
    """Return (order id, award time) of the newest credits awarded since then, at most `limit` of them."""
    credits = OrderCredit.objects.filter(created_at__gte=since).order_by("-created_at")
    return list(credits.values_list("order_id", "created_at")[:limit])


@dataclass(frozen=True)
class VersionQueue:
    version: int
    queue: str
    messages: int  # ready to deliver: waiting for a consumer of the version
    consumers: int


def version_queues() -> list[VersionQueue]:
    """Return, for each message version this code knows, how many messages its queue holds and how many consume it.

    Read from the broker (passive declares on one connection, a few milliseconds); a queue not declared yet holds
    nothing and has no consumer. Raises the broker's error when it cannot be reached.
    """
    found = []
    with Connection(settings.CELERY_BROKER_URL, connect_timeout=BROKER_READ_TIMEOUT_SECONDS) as conn:
        connection_ensure(conn, timeout=BROKER_READ_TIMEOUT_SECONDS)
        channel = conn.channel()
        for version in sorted(SCHEMA_VERSIONS):
            name = credits_queue_name(version)
            try:
                _, messages, consumers = channel.queue_declare(name, passive=True)
            except ChannelError:  # not found: the broker closed the channel
                messages = consumers = 0
                channel = conn.channel()
            found.append(VersionQueue(version=version, queue=name, messages=messages, consumers=consumers))
    return found
