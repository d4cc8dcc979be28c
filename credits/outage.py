"""The credits database outage, in one place: how long a delivery waits, how it polls, and the loop that waits.

An outage is not the message's fault: while the credits database cannot be reached (credits.retry classifies the
error as database_unavailable), the consumer waits for it, up to CREDITS_OUTAGE_WAIT_SECONDS, trying a new
connection after pauses doubling from OUTAGE_POLL_FIRST_SECONDS to OUTAGE_POLL_MAX_SECONDS, and calls the award
again once one opens. When the wait runs out the task puts the message back on the queue as it was
(credits/tasks.py), spending none of its retries: consumption slows to about one connection attempt a second until
the database answers, and no message turns into a dead letter meanwhile.
"""

import contextlib
import itertools
import time
from collections.abc import Callable
from typing import TypeVar

from django.conf import settings
from django.db import DatabaseError, connections

from core.backoff import backoff_delay
from credits.retry import failure_classify
from credits.services import credits_database

# The pauses between two connection attempts while waiting: doubling from the first to the longest.
OUTAGE_POLL_FIRST_SECONDS = 0.05
OUTAGE_POLL_MAX_SECONDS = 1.0

T = TypeVar("T")


def outage_wait_seconds() -> float:
    """Return how long one delivery waits for an unreachable credits database (CREDITS_OUTAGE_WAIT_SECONDS)."""
    return settings.CREDITS_OUTAGE_WAIT_SECONDS


def credits_database_wait(*, until: float) -> bool:
    """Wait until the credits database takes a connection, at most until this monotonic time; return whether it did."""
    connection = connections[credits_database()]
    for attempt in itertools.count():
        with contextlib.suppress(DatabaseError):  # closing a connection the server dropped can fail too
            connection.close()
        try:
            connection.ensure_connection()
            return True
        except DatabaseError:
            pass
        remaining = until - time.monotonic()
        if remaining <= 0:
            return False
        pause = backoff_delay(attempt, base=OUTAGE_POLL_FIRST_SECONDS, cap=OUTAGE_POLL_MAX_SECONDS, jitter=False)
        time.sleep(min(pause, remaining))


def through_outage(call: Callable[[], T]) -> T:
    """Return call(); while the credits database cannot be reached, wait for it (a while) and call again."""
    until = time.monotonic() + outage_wait_seconds()
    while True:
        try:
            return call()
        except Exception as exc:
            if not failure_classify(exc).outage or time.monotonic() >= until:
                raise
            if not credits_database_wait(until=until):
                raise
