"""Building the Celery task message that carries one outbox row to the credits consumer."""

import socket

import amqp
from celery import current_app as app
from kombu.serialization import dumps

from core import tracing
from core.contract import AWARD_CREDITS_TASK, CREATED_AT_HEADER
from outbox.claims import ClaimedMessage

_ORIGIN = f"outbox-relay@{socket.gethostname()}"
# Celery's own cap on the argument summaries it puts in the headers.
_REPR_MAX = 1024
# Protocol-2 headers left out of the message. For a task published this way (no ETA, expiry, group, time limit,
# parent, stamps or shadow name) each holds what a worker does without it: no value, [None, None], {} or 0; the root
# id is the task id, which Celery falls back to; ignore_result False, where absent means the task's own setting
# (results are ignored and there is no result backend, so nothing is stored either way); lang, which workers never
# read. py-amqp decodes every header of every message in Python: these thirteen were about 5% of a profiled
# worker's CPU per award (docs/PERFORMANCE.md). A message with or without them runs the same on any worker of this
# Celery version (outbox/tests/test_messages.py), so relays and workers old and new mix. Kept: task and id
# (required), retries, origin and the argument summaries (for people reading credits.dead or `celery inspect`), and
# this project's own headers.
DEFAULT_VALUED_HEADERS = (
    "lang",
    "shadow",
    "eta",
    "expires",
    "group",
    "group_index",
    "timelimit",
    "root_id",
    "parent_id",
    "ignore_result",
    "replaced_task_nesting",
    "stamped_headers",
    "stamps",
)


def build_task_message(message: ClaimedMessage) -> amqp.Message:
    """Return the Celery protocol-2 task message for one outbox row, built by Celery itself.

    Equivalent to ``send_task("credits.award_credits", kwargs={"message": payload}, task_id=<transaction id>)``: the
    transaction id is the task id, the correlation id and the AMQP message id. The headers also carry the row's
    creation time (for the consumer's end-to-end latency) and the writing request's trace context, so the
    consumer's spans continue that request's trace rather than the relay's. Headers holding only what a worker
    assumes without them are left out (DEFAULT_VALUED_HEADERS).
    """
    kwargs = {"message": message.payload}
    headers, properties, body, _ = app.amqp.as_task_v2(
        message.id,
        AWARD_CREDITS_TASK,
        args=(),
        kwargs=kwargs,
        # The payload is small and flat; repr() says the same as Celery's saferepr at a fraction of the cost.
        argsrepr="()",
        kwargsrepr=repr(kwargs)[:_REPR_MAX],
        origin=_ORIGIN,
    )
    for name in DEFAULT_VALUED_HEADERS:
        del headers[name]
    if message.created_at is not None:
        headers[CREATED_AT_HEADER] = message.created_at.timestamp()
    if message.traceparent:
        headers[tracing.TRACEPARENT] = message.traceparent
        if message.tracestate:
            headers[tracing.TRACESTATE] = message.tracestate
    content_type, content_encoding, data = dumps(body, serializer="json")
    return amqp.Message(
        data,
        content_type=content_type,
        content_encoding=content_encoding,
        application_headers=headers,
        delivery_mode=2,
        message_id=message.id,
        **properties,
    )
