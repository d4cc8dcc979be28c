"""What the credits consumer reads from a message's headers besides its body: the relay's creation timestamp."""

import time

from core.contract import CREATED_AT_HEADER


def message_created_at(request) -> float | None:
    """Return when the message's outbox row was written (Unix seconds), or None if the message does not say.

    Celery exposes protocol-2 headers as request attributes; a retry may carry them nested under ``headers``.
    """
    value = getattr(request, CREATED_AT_HEADER, None) or (request.headers or {}).get(CREATED_AT_HEADER)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def message_age_seconds(request) -> float | None:
    """Return how long ago the message's outbox row was written, or None if unknown."""
    created_at = message_created_at(request)
    return None if created_at is None else max(0.0, time.time() - created_at)


def headers_to_carry(request) -> dict:
    """Return the headers a retry of this message must carry again: Celery does not copy them over by itself."""
    created_at = message_created_at(request)
    return {} if created_at is None else {CREATED_AT_HEADER: created_at}
