"""Reads of the outbox state: how far behind the relay is, and what needs a person."""

from collections.abc import Iterable
from datetime import datetime

from django.utils import timezone

from outbox.models import TransactionLog


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


def message_trace_contexts(*, ids: Iterable[str]) -> dict[str, tuple[str, str]]:
    """Return the (traceparent, tracestate) each of these outbox rows was written with, by transaction id."""
    return {
        row_id: (traceparent, tracestate)
        for row_id, traceparent, tracestate in TransactionLog.objects.filter(id__in=list(ids))
        .exclude(traceparent="")
        .values_list("id", "traceparent", "tracestate")
    }
