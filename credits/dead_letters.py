"""Dead-lettering a credits message: its admin row recorded (through an outage), then the message rejected.

A message is dead-lettered when its failure is permanent or it has spent its retries (credits/retry.py says which).
Its DeadLetter row is what the admin lists and replays; the broker's copy goes through credits.dlx to credits.dead.
Every dead letter gets its row: when the credits database cannot be reached to record it, the whole message goes back
on the queue (credits/outage.py) to be tried again once the database is back.
"""

import logging
from datetime import datetime
from typing import Any, NoReturn

from celery import Task
from celery.exceptions import Reject
from django.db import DatabaseError, connections

from core import tracing
from credits import metrics, outage, services
from credits.retry import Failure, failure_classify

logger = logging.getLogger(__name__)


def dead_letter(
    task: Task,
    failure: Failure,
    exc: Exception,
    payload: Any,
    *,
    error: str,
    first_failed_at: datetime,
    failed_at: datetime,
) -> NoReturn:
    """Record the message in hand as a dead letter, then reject it to credits.dead."""
    request = task.request
    attempts = request.retries + 1
    recorded = "recorded for the admin"
    connection = connections[services.credits_database()]
    if isinstance(exc, DatabaseError) and not connection.in_atomic_block:
        # The failed connection may be unusable; the record below opens a fresh one.
        connection.close()
    try:
        with tracing.span("credits.dead_letter", attributes={"credits.reason": failure.reason}):
            outage.through_outage(
                lambda: services.dead_letter_record(
                    message_id=str(request.id),
                    payload=payload,
                    reason=failure.reason,
                    error=error,
                    attempts=attempts,
                    first_failed_at=first_failed_at,
                    last_failed_at=failed_at,
                    trace_context=tracing.current_trace_context(),
                )
            )
    except Exception as record_exc:
        record_failure = failure_classify(record_exc)
        if record_failure.outage:
            # Every dead letter gets its row: try the whole message again once the database is back.
            outage.requeue(task, record_failure, record_exc, payload)
        # The broker copy in credits.dead still holds the message.
        recorded = f"NOT recorded for the admin ({type(record_exc).__name__}: {record_exc}); it is in credits.dead"
    metrics.DEAD_LETTERED.labels(reason=failure.reason).inc()
    logger.error(
        "credits message %s dead-lettered after %d attempt(s), %s (%s): %s; payload %s",
        request.id,
        attempts,
        recorded,
        failure.reason,
        error,
        payload,
    )
    # Not requeued: the broker routes a rejected message through credits.dlx to the credits.dead queue.
    raise Reject(error, requeue=False) from exc
