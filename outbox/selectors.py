"""Reads of the outbox state: how far behind the relay is, and what needs a person."""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from core.minutes import Minutes, counts_per_minute
from outbox.models import TransactionLog


@dataclass(frozen=True)
class OutboxStates:
    """How many rows wait in each state a person asks about (the admin's delivery filter), and the oldest due age."""

    due: int
    backing_off: int
    stuck: int
    dead: int
    oldest_due_seconds: float


def outbox_lag_seconds(*, now: datetime | None = None) -> float:
    """Return how long the oldest due message has been due, 0 when nothing is due.

    Measured from next_attempt_at, which for a new row is its creation time: one index probe on (status,
    next_attempt_at) however large the backlog.
    """
    now = now or timezone.now()
    oldest = (
        TransactionLog.objects.filter(status=TransactionLog.Status.PENDING, next_attempt_at__lte=now)
        .order_by("next_attempt_at")
        .values_list("next_attempt_at", flat=True)
        .first()
    )
    return max(0.0, (now - oldest).total_seconds()) if oldest else 0.0


def outbox_dead_count() -> int:
    """Return how many messages were given up on and wait for a person."""
    return TransactionLog.objects.filter(status=TransactionLog.Status.DEAD).count()


def outbox_states(*, now: datetime | None = None) -> OutboxStates:
    """Return the rows due now, backing off after a failure, stuck and dead, as the admin's filters count them."""
    now = now or timezone.now()
    pending = TransactionLog.objects.filter(status=TransactionLog.Status.PENDING)
    return OutboxStates(
        due=pending.filter(next_attempt_at__lte=now).count(),
        backing_off=pending.filter(next_attempt_at__gt=now, attempts__gt=0).count(),
        stuck=pending.filter(created_at__lte=now - timedelta(seconds=settings.OUTBOX_STUCK_SECONDS)).count(),
        dead=outbox_dead_count(),
        oldest_due_seconds=outbox_lag_seconds(now=now),
    )


def outbox_published_per_minute(*, minutes: Minutes) -> list[int]:
    """Return how many rows were marked published in each minute, oldest first (the retention index's range)."""
    published = TransactionLog.objects.filter(status=TransactionLog.Status.PUBLISHED)
    return counts_per_minute(published, field="published_at", minutes=minutes)


def message_trace_contexts(*, ids: Iterable[str]) -> dict[str, tuple[str, str]]:
    """Return the (traceparent, tracestate) each of these outbox rows was written with, by transaction id."""
    return {
        row_id: (traceparent, tracestate)
        for row_id, traceparent, tracestate in TransactionLog.objects.filter(id__in=list(ids))
        .exclude(traceparent="")
        .values_list("id", "traceparent", "tracestate")
    }
