"""The credits consumer's retry policy, all in one place.

It follows the design the service comes from (reconsume up to 3 times, then the dead-letter queue):
- Permanent (dead-lettered at once): a malformed message or an unknown schema version. Retrying the same message
  cannot change the outcome; an operator can still replay the dead letter after fixing the cause.
- Retried: every other failure (a deadlock, a lock wait timeout, a refused insert, an error nobody foresaw), since it
  is not known to be permanent. After the last retry the message is dead-lettered.
- A newer schema version than this consumer accepts is not the message's fault either, nor this consumer's: during a
  rolling upgrade a newer consumer may be running beside it. Messages are routed by version, so one reaches this
  consumer only from a relay or consumer of the release before (it is forwarded to its version's queue, spending none
  of its retries) or after waiting CREDITS_UNKNOWN_VERSION_WAIT_SECONDS there for a consumer that accepts it (then it
  is dead-lettered, version_not_supported): credits/versions.py. A version older than every accepted one is
  permanent, as above.
- An outage is not the message's fault: an error meaning the credits database cannot be reached is classified here
  (database_unavailable); the waiting, the polling and what follows are credits/outage.py's.
- Backoff: capped exponential with equal jitter (core/backoff.py); retry n (0-based) waits d/2 + uniform(0, d/2)
  seconds, where d = min(CREDITS_RETRY_MAX_SECONDS, CREDITS_RETRY_BASE_SECONDS * 2**n). Half of each delay is fixed,
  so delays grow from one retry to the next; the random half spreads a burst of failures so they do not retry in
  lockstep.
- Limit: CREDITS_MAX_RETRIES retries after the first attempt; after the last, the message is dead-lettered
  (credits/dead_letters.py). The same limit bounds redeliveries (a message a worker died holding, counted by quorum
  queues): one redelivered more often is dead-lettered without being tried (credits/tasks.py), as a permanent,
  unexpected failure.
- The retry itself (retry_later): the message published again to its version's queue after the delay, its headers
  carried over and its first failure's time added, so the dead letter can say when it began.
"""

import logging
import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import MySQLdb
from celery import Task
from celery.exceptions import Reject
from django.conf import settings
from django.db import Error as DatabaseError
from django.db import InterfaceError

from core import tracing
from core.backoff import backoff_delay
from core.contract import QUEUE_TYPE_QUORUM
from core.credits_queues import queue_for
from credits import metrics, versions
from credits.errors import MalformedMessage, NewerSchemaVersion, Redelivered, UnsupportedSchemaVersion
from credits.headers import FIRST_FAILED_HEADER, headers_to_carry
from credits.models import DeadLetter

logger = logging.getLogger(__name__)

Reason = DeadLetter.Reason

ER_LOCK_WAIT_TIMEOUT = 1205
ER_LOCK_DEADLOCK = 1213
# Server and client error codes meaning "no usable connection right now"; a new connection may work later.
CONNECTION_ERRORS = frozenset(
    {
        1040,  # ER_CON_COUNT_ERROR: too many connections
        1053,  # ER_SERVER_SHUTDOWN
        1927,  # ER_CONNECTION_KILLED (MariaDB)
        2002,  # CR_CONNECTION_ERROR: cannot connect through the socket
        2003,  # CR_CONN_HOST_ERROR: cannot connect to the host (server down)
        2006,  # CR_SERVER_GONE_ERROR
        2013,  # CR_SERVER_LOST: lost connection during a query
        2055,  # CR_SERVER_LOST_EXTENDED
        4031,  # ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8): the server closed an idle connection
    }
)

_PERMANENT = {
    MalformedMessage: Reason.MALFORMED,
    UnsupportedSchemaVersion: Reason.UNSUPPORTED_SCHEMA,
    # Permanent for this consumer; forwarded to its version's queue until the wait there runs out (credits/versions.py).
    NewerSchemaVersion: Reason.VERSION_NOT_SUPPORTED,
    # Trying it again could kill another worker; an operator replays it after a look.
    Redelivered: Reason.UNEXPECTED,
}


@dataclass(frozen=True)
class Failure:
    reason: str
    transient: bool
    error: str

    @property
    def outage(self) -> bool:
        """Whether the database could not be reached: wait for it, without spending the message's retries."""
        return self.reason == Reason.DATABASE_UNAVAILABLE

    @property
    def newer_version(self) -> bool:
        """Whether the message is newer than this consumer accepts: forwarded, or it waited out its version's queue."""
        return self.reason == Reason.VERSION_NOT_SUPPORTED


def _database_error_code(exc: BaseException) -> int | None:
    # Django re-raises the driver's error with the same args: (code, message).
    code = exc.args[0] if exc.args else None
    return code if isinstance(code, int) else None


def failure_classify(exc: BaseException) -> Failure:
    """Return why the award failed and whether trying the same message again can succeed."""
    error = f"{type(exc).__name__}: {exc}"
    for error_type, reason in _PERMANENT.items():
        if isinstance(exc, error_type):
            return Failure(reason=reason, transient=False, error=error)
    if isinstance(exc, DatabaseError | MySQLdb.Error):
        code = _database_error_code(exc)
        if code == ER_LOCK_DEADLOCK:
            return Failure(reason=Reason.DEADLOCK, transient=True, error=error)
        if code == ER_LOCK_WAIT_TIMEOUT:
            return Failure(reason=Reason.LOCK_WAIT_TIMEOUT, transient=True, error=error)
        # InterfaceError: Django or the driver found the connection already closed.
        if code in CONNECTION_ERRORS or isinstance(exc, InterfaceError | MySQLdb.InterfaceError):
            return Failure(reason=Reason.DATABASE_UNAVAILABLE, transient=True, error=error)
    return Failure(reason=Reason.UNEXPECTED, transient=True, error=error)


def max_retries() -> int:
    """Return how many more tries a message gets after its first, by retry or by redelivery (CREDITS_MAX_RETRIES)."""
    return settings.CREDITS_MAX_RETRIES


def retry_allowed(failure: Failure, *, retries: int) -> bool:
    """Return whether a message that failed this way, after this many retries, gets another try."""
    return failure.transient and retries < max_retries()


def retry_delay(retries: int) -> float:
    """Return the seconds to wait before retry number `retries` (0-based), capped and jittered."""
    return backoff_delay(retries, base=settings.CREDITS_RETRY_BASE_SECONDS, cap=settings.CREDITS_RETRY_MAX_SECONDS)


def countdown(delay: float) -> float:
    """Return a delay the broker can keep: on quorum queues, native delayed delivery counts whole seconds only."""
    if settings.CELERY_QUEUE_TYPE == QUEUE_TYPE_QUORUM:
        # It rounds a countdown down and refuses one under 1 s.
        return max(1, math.ceil(delay))
    return delay


def retry_later(
    task: Task, failure: Failure, exc: Exception, payload: Any, *, first_failed_at: datetime, error: str
) -> str:
    """Publish the message in hand again after its backoff delay and raise the Retry that acknowledges this delivery.

    Returns only when Celery could not publish the retry (it would reject the message unrecorded): then the error the
    message is dead-lettered with instead.
    """
    request = task.request
    delay = countdown(retry_delay(request.retries))
    try:
        with tracing.span("credits.retry", attributes={"credits.reason": failure.reason, "credits.delay_s": delay}):
            retry_signal = task.retry(
                exc=exc,
                countdown=delay,
                headers={FIRST_FAILED_HEADER: first_failed_at.isoformat(), **headers_to_carry(request)},
                # Its version's queue, named: on quorum queues Celery would route the delayed message by the task's
                # route (`credits`) instead of the delivery's.
                queue=queue_for(versions.resend_queue(request, payload)),
                throw=False,
            )
    except Reject as not_published:
        return f"{error}; the retry could not be published: {not_published.reason}"
    metrics.RETRIES.labels(reason=failure.reason).inc()
    logger.warning(
        "credits message %s failed (%s), retry %d in %.2fs: %s",
        request.id,
        failure.reason,
        request.retries + 1,
        delay,
        error,
    )
    raise retry_signal
