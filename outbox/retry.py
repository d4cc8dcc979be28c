"""The relay's retry policy for failed publishes, all in one place.

Every failed publish (nack, unroutable, confirm timeout, connection lost mid-batch) counts as one attempt and waits
base * 2^(attempts-1) seconds (OUTBOX_BACKOFF_BASE_SECONDS), capped (OUTBOX_BACKOFF_MAX_SECONDS), with "equal
jitter" (half fixed, half random; core/backoff.py) so rows that failed together do not retry together. The
OUTBOX_MAX_ATTEMPTS-th failure makes the row dead (outbox/marks.py): it leaves the relay, shows in the admin's dead
filter, in /healthz and /metrics, and goes back to pending only by "retry now". A broker that cannot be reached at
all costs no attempts: the relay connects before it claims anything.
"""

from django.conf import settings

from core.backoff import backoff_delay


def retry_delay(attempts: int) -> float:
    """Return the seconds to wait before publishing again a message that has failed `attempts` times."""
    return backoff_delay(
        max(attempts, 1) - 1, base=settings.OUTBOX_BACKOFF_BASE_SECONDS, cap=settings.OUTBOX_BACKOFF_MAX_SECONDS
    )
