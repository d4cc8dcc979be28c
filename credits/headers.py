"""What the credits consumer reads from a message's headers besides its body, and what a message sent again keeps.

Celery exposes protocol-2 headers as request attributes; a message published again (a retry, a forward, a requeue)
may carry them nested under ``headers``.
"""

import time
from datetime import datetime
from typing import Any

from core.contract import CREATED_AT_HEADER

# Carried from one retry to the next, so the dead letter can say when the message first failed.
FIRST_FAILED_HEADER = "credits_first_failed_at"
# Set by quorum queues: how many times this message was delivered before and came back unacknowledged.
DELIVERY_COUNT_HEADER = "x-delivery-count"


def header(request, name: str) -> Any:
    """Return the header `name` of the delivery in hand, wherever Celery put it; None if it has none."""
    return (request.headers or {}).get(name) or getattr(request, name, None)


def message_created_at(request) -> float | None:
    """Return when the message's outbox row was written (Unix seconds), or None if the message does not say."""
    value = getattr(request, CREATED_AT_HEADER, None) or (request.headers or {}).get(CREATED_AT_HEADER)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def message_age_seconds(request) -> float | None:
    """Return how long ago the message's outbox row was written, or None if unknown."""
    created_at = message_created_at(request)
    return None if created_at is None else max(0.0, time.time() - created_at)


def redeliveries(request) -> int:
    """Return how many times a quorum queue delivered this message before, unacknowledged (0 if it does not say)."""
    value = (request.headers or {}).get(DELIVERY_COUNT_HEADER) or getattr(request, DELIVERY_COUNT_HEADER, 0)
    return value if isinstance(value, int) else 0


def first_failed_at(request) -> datetime | None:
    """Return when the message first failed, as its earlier retry recorded it; None if it never failed before."""
    value = header(request, FIRST_FAILED_HEADER)
    try:
        moment = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None
    return moment if moment is not None and moment.tzinfo is not None else None


def headers_to_carry(request) -> dict:
    """Return the headers a retry of this message must carry again: Celery does not copy them over by itself."""
    created_at = message_created_at(request)
    return {} if created_at is None else {CREATED_AT_HEADER: created_at}


def carried_headers(request) -> dict:
    """Return the headers a message sent again must keep: the relay's, and when it first failed, if it did."""
    headers = headers_to_carry(request)
    if (failed_at := first_failed_at(request)) is not None:
        headers[FIRST_FAILED_HEADER] = failed_at.isoformat()
    return headers
