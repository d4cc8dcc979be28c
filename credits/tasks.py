"""The credits consumer as a Celery task: parse the message, call the award service, apply the retry policy.

Delivery (config/celery.py): acks late, and a message whose worker process dies mid-task is requeued, so every
message is applied at least once; the UNIQUE order_id in the award service makes the effect exactly once. A message
of a version this consumer does not accept is forwarded or dead-lettered by credits/versions.py.
"""

import logging
import math
from datetime import datetime
from typing import Any, NoReturn

from celery import Task, shared_task
from celery.exceptions import Reject, Retry
from django.conf import settings
from django.db import DatabaseError, connections
from django.utils import timezone

from core import tracing
from core.contract import AWARD_CREDITS_TASK, QUEUE_TYPE_QUORUM
from core.credits_queues import queue_for
from core.logs import transaction_bind, transaction_unbind
from credits import metrics, outage, retry, services, versions
from credits.errors import MalformedMessage, NewerSchemaVersion, Redelivered
from credits.headers import headers_to_carry, message_age_seconds
from credits.messages import award_message_parse

logger = logging.getLogger(__name__)

# On a quorum queue, how long a message put back during an outage waits before it is delivered again (whole seconds:
# native delayed delivery).
OUTAGE_REPUBLISH_SECONDS = 1
# Carried from one retry to the next, so the dead letter can say when the message first failed.
FIRST_FAILED_HEADER = "credits_first_failed_at"
# Set by quorum queues: how many times this message was delivered before and came back unacknowledged.
DELIVERY_COUNT_HEADER = "x-delivery-count"


def _redeliveries(request) -> int:
    value = (request.headers or {}).get(DELIVERY_COUNT_HEADER) or getattr(request, DELIVERY_COUNT_HEADER, 0)
    return value if isinstance(value, int) else 0


def _header(request, name: str) -> Any:
    # Celery exposes protocol-2 headers as request attributes; a republished message may carry them under `headers`.
    return (request.headers or {}).get(name) or getattr(request, name, None)


def _header_datetime(request, name: str) -> datetime | None:
    value = _header(request, name)
    try:
        moment = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None
    return moment if moment is not None and moment.tzinfo is not None else None


def _first_failed_at(request) -> datetime | None:
    return _header_datetime(request, FIRST_FAILED_HEADER)


def _carried_headers(request) -> dict:
    """Return the headers a message sent again must keep: the relay's, and when it first failed, if it did."""
    headers = headers_to_carry(request)
    if (first_failed_at := _first_failed_at(request)) is not None:
        headers[FIRST_FAILED_HEADER] = first_failed_at.isoformat()
    return headers


def _countdown(delay: float) -> float:
    """Return a delay the broker can keep: on quorum queues, native delayed delivery counts whole seconds only."""
    if settings.CELERY_QUEUE_TYPE == QUEUE_TYPE_QUORUM:
        # It rounds a countdown down and refuses one under 1 s.
        return max(1, math.ceil(delay))
    return delay


def _fail(task: Task, exc: Exception, payload: Any) -> NoReturn:
    """Retry the message after a transient failure, or dead-letter it: record it, then reject it to credits.dead."""
    failure = retry.failure_classify(exc)
    request = task.request
    if failure.outage:
        _requeue_during_outage(task, failure, exc, payload)
    now = timezone.now()
    first_failed_at = _first_failed_at(request) or now
    error = failure.error
    if failure.newer_version:
        error = f"{error}; {versions.waited_error(request)}"
    if retry.retry_allowed(failure, retries=request.retries):
        delay = _countdown(retry.retry_delay(request.retries))
        try:
            with tracing.span("credits.retry", attributes={"credits.reason": failure.reason, "credits.delay_s": delay}):
                retry_signal = task.retry(
                    exc=exc,
                    countdown=delay,
                    headers={FIRST_FAILED_HEADER: first_failed_at.isoformat(), **headers_to_carry(request)},
                    # Its version's queue, named: on quorum queues Celery would route the delayed message by the
                    # task's route (`credits`) instead of the delivery's.
                    queue=queue_for(versions.resend_queue(request, payload)),
                    throw=False,
                )
        except Reject as not_published:
            # Celery could not publish the retry and would reject the message unrecorded; dead-letter it here.
            error = f"{error}; the retry could not be published: {not_published.reason}"
        else:
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
                    last_failed_at=now,
                    trace_context=tracing.current_trace_context(),
                )
            )
    except Exception as record_exc:
        record_failure = retry.failure_classify(record_exc)
        if record_failure.outage:
            # Every dead letter gets its row: try the whole message again once the database is back.
            _requeue_during_outage(task, record_failure, record_exc, payload)
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


def _requeue_during_outage(task: Task, failure: retry.Failure, exc: Exception, payload: Any) -> NoReturn:
    """Put the message back on the queue as it was: the database being down is not the message's fault.

    A classic queue takes it back as it is (reject with requeue). A quorum queue would count that as a delivery,
    toward its delivery limit and the redelivery check above; there the message is published again, its retries and
    headers unchanged, a second later (native delayed delivery), and the delivery in hand is acknowledged.
    """
    metrics.OUTAGE_REQUEUES.inc()
    request = task.request
    logger.warning(
        "credits message %s put back on the queue: the credits database has not answered for %.0fs (%s)",
        request.id,
        outage.outage_wait_seconds(),
        failure.error,
    )
    if settings.CELERY_QUEUE_TYPE != QUEUE_TYPE_QUORUM or request.is_eager:
        raise Reject(failure.error, requeue=True) from exc
    raise _republish(
        task,
        exc,
        countdown=OUTAGE_REPUBLISH_SECONDS,
        headers=_carried_headers(request),
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


@shared_task(
    bind=True,
    name=AWARD_CREDITS_TASK,
    # The retry policy in credits/retry.py is the only limit; Celery's own default (3) must not cut it short.
    max_retries=None,
    # An error escaping the task (none should) rejects the message to credits.dead instead of acking it away.
    acks_on_failure_or_timeout=False,
    # The message body is decoded once per delivery, not twice.
    Request="core.celery_request:DecodedOnceRequest",
)
def award_credits(self: Task, *args: Any, **kwargs: Any) -> str:
    """Award the credits one transaction_log message asks for: kwargs {"message": payload}, no positional args.

    Any other call shape is a malformed message, dead-lettered like the rest rather than failing inside Celery.
    """
    # The task id is the outbox transaction id: every record the award logs carries it. Bound and unbound here rather
    # than by task_prerun/task_postrun receivers, which Celery's tracer would signal for every task (core/worker.py);
    # the lines Celery logs itself once the run returned (a retry, a failure) name the id in their text.
    # The request is looked up once: each self.request is a look-up in Celery's thread-local stack.
    request = self.request
    transaction_bind(str(request.id))
    try:
        return _award(self, request, args, kwargs)
    finally:
        transaction_unbind()


def _award(self: Task, request, args: tuple, kwargs: dict) -> str:
    well_formed_call = not args and set(kwargs) == {"message"}
    payload = kwargs["message"] if well_formed_call else {"args": list(args), "kwargs": kwargs}
    if versions.dead_lettered_before(request):
        raise versions.pass_on(request)
    try:
        if (redeliveries := _redeliveries(request)) > retry.max_retries():
            raise Redelivered(f"delivered {redeliveries + 1} times, never acknowledged (the worker died each time)")
        if not well_formed_call:
            raise MalformedMessage('expected keyword argument "message" only')
        message = award_message_parse(payload)
        with tracing.span("credits.award", attributes={"creditshop.order_id": message.order_id}):
            award = outage.through_outage(
                lambda: services.credit_award(
                    transaction_id=message.transaction_id,
                    order_id=message.order_id,
                    user_id=message.user_id,
                    total=message.total,
                    ordered_at=message.ordered_at,
                )
            )
    except NewerSchemaVersion as exc:
        if not versions.waited(request):
            return versions.forward(self, request, payload, exc, headers=_carried_headers(request))
        _fail(self, exc, payload)
    except Exception as exc:  # every failure goes through the one retry policy
        _fail(self, exc, payload)
    if not award.created:
        metrics.AWARDS_DUPLICATE.inc()
        return "duplicate"
    metrics.AWARDS_AWARDED.inc()
    if (age := message_age_seconds(request)) is not None:
        metrics.ORDER_TO_CREDIT.observe(age)
    return "awarded"
