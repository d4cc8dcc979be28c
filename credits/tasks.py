"""The credits consumer as a Celery task: parse the message, call the award service, hand a failure to its policy.

Delivery (config/celery.py): acks late, and a message whose worker process dies mid-task is requeued, so every
message is applied at least once; the UNIQUE order_id in the award service makes the effect exactly once. A message
of a version this consumer does not accept is forwarded or dead-lettered by credits/versions.py. A failure's policy
lives with its kind: the outage wait and requeue in credits/outage.py, the retry with backoff in credits/retry.py,
dead-lettering in credits/dead_letters.py; _fail only classifies the failure and calls them.
"""

from typing import Any, NoReturn

from celery import Task, shared_task
from django.utils import timezone

from core import tracing
from core.contract import AWARD_CREDITS_TASK
from core.logs import transaction_bind, transaction_unbind
from credits import metrics, outage, retry, services, versions
from credits.dead_letters import dead_letter
from credits.errors import MalformedMessage, NewerSchemaVersion, Redelivered
from credits.headers import carried_headers, first_failed_at, message_age_seconds, redeliveries
from credits.messages import award_message_parse


def _fail(task: Task, exc: Exception, payload: Any) -> NoReturn:
    """Apply the policy of the failure's kind: wait out an outage, retry with backoff, or dead-letter."""
    failure = retry.failure_classify(exc)
    request = task.request
    if failure.outage:
        outage.requeue(task, failure, exc, payload)
    now = timezone.now()
    failed_first = first_failed_at(request) or now
    error = failure.error
    if failure.newer_version:
        error = f"{error}; {versions.waited_error(request)}"
    if retry.retry_allowed(failure, retries=request.retries):
        error = retry.retry_later(task, failure, exc, payload, first_failed_at=failed_first, error=error)
    dead_letter(task, failure, exc, payload, error=error, first_failed_at=failed_first, failed_at=now)


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
        if (redelivered := redeliveries(request)) > retry.max_retries():
            raise Redelivered(f"delivered {redelivered + 1} times, never acknowledged (the worker died each time)")
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
            return versions.forward(self, request, payload, exc, headers=carried_headers(request))
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
