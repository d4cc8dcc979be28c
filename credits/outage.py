"""The credits database outage, in one place: how long a delivery waits, how it polls, the loop, the requeue.

An outage is not the message's fault: while the credits database cannot be reached (credits.retry classifies the
error as database_unavailable), the consumer waits for it, up to CREDITS_OUTAGE_WAIT_SECONDS, trying a new
connection after pauses doubling from OUTAGE_POLL_FIRST_SECONDS to OUTAGE_POLL_MAX_SECONDS, and calls the award
again once one opens. When the wait runs out the message goes back on the queue as it was (requeue), spending none
of its retries: consumption slows to about one connection attempt a second until the database answers, and no message
turns into a dead letter meanwhile.
"""

import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from celery import Task
from celery.exceptions import Reject, Retry
from django.conf import settings
from django.db import DatabaseError, connections

from core.backoff import backoff_delay
from core.contract import QUEUE_TYPE_QUORUM
from core.credits_queues import queue_for
from credits import metrics, versions
from credits.headers import carried_headers
from credits.retry import Failure, failure_classify
from credits.services import credits_database

logger = logging.getLogger(__name__)

# The pauses between two connection attempts while waiting: doubling from the first to the longest.
OUTAGE_POLL_FIRST_SECONDS = 0.05
OUTAGE_POLL_MAX_SECONDS = 1.0
# On a quorum queue, how long a message put back during an outage waits before it is delivered again (whole seconds:
# native delayed delivery).
OUTAGE_REPUBLISH_SECONDS = 1

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


def requeue(task: Task, failure: Failure, exc: Exception, payload: Any) -> NoReturn:
    """Put the message back on the queue as it was: the database being down is not the message's fault.

    A classic queue takes it back as it is (reject with requeue). A quorum queue would count that as a delivery,
    toward its delivery limit and the task's redelivery check; there the message is published again, its retries and
    headers unchanged, a second later (native delayed delivery), and the delivery in hand is acknowledged.
    """
    metrics.OUTAGE_REQUEUES.inc()
    request = task.request
    logger.warning(
        "credits message %s put back on the queue: the credits database has not answered for %.0fs (%s)",
        request.id,
        outage_wait_seconds(),
        failure.error,
    )
    if settings.CELERY_QUEUE_TYPE != QUEUE_TYPE_QUORUM or request.is_eager:
        raise Reject(failure.error, requeue=True) from exc
    raise _republish(
        task,
        exc,
        countdown=OUTAGE_REPUBLISH_SECONDS,
        headers=carried_headers(request),
        error=failure.error,
        queue=versions.resend_queue(request, payload),
    )


def _republish(task: Task, exc: Exception, *, countdown: float, headers: dict, error: str, queue: str) -> Retry:
    """Publish the message in hand again to `queue` with these headers, retries unchanged; return the Retry to raise.

    Raised, the Retry acknowledges the delivery in hand. If the publish fails, Reject puts the delivery back instead.
    """
    request = task.request
    again = task.signature_from_request(
        request, queue=queue_for(queue), countdown=countdown, retries=request.retries, headers=headers
    )
    try:
        again.apply_async()
    except Exception as publish_exc:  # the broker copy stays unacknowledged, so the queue keeps it
        raise Reject(f"{error}; republishing failed: {publish_exc}", requeue=True) from exc
    # Raised, it acknowledges the delivery in hand, as a retry does; `again` carries the message on.
    return Retry(exc=exc, when=countdown, sig=again)
