"""Building the Celery task message that carries one outbox row to the credits consumer."""

import functools
import json
import socket

import amqp
from celery import current_app as app

from core import tracing
from core.contract import AWARD_CREDITS_TASK, CREATED_AT_HEADER
from outbox.claims import ClaimedMessage

_ORIGIN = f"outbox-relay@{socket.gethostname()}"
# Celery's own cap on the argument summaries it puts in the headers.
_REPR_MAX = 1024
_TEMPLATE_ID = "template"
# Protocol-2 headers left out of the message. For a task published this way (no ETA, expiry, group, time limit,
# parent, stamps or shadow name) each holds what a worker does without it: no value, [None, None], {} or 0; the root
# id is the task id, which Celery falls back to; ignore_result False, where absent means the task's own setting
# (results are ignored and there is no result backend, so nothing is stored either way); lang, which workers never
# read. py-amqp decodes every header of every message in Python, on every award, so a header that says nothing is
# work for each worker (docs/PERFORMANCE.md). A message with or without them runs the same on any worker of this
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
    """Return the Celery protocol-2 task message for one outbox row, as Celery itself builds it.

    Equivalent to ``send_task("credits.award_credits", kwargs={"message": payload}, task_id=<transaction id>)``: the
    transaction id is the task id, the correlation id and the AMQP message id. The headers also carry the row's
    creation time (for the consumer's end-to-end latency) and the writing request's trace context, so the
    consumer's spans continue that request's trace rather than the relay's. Headers holding only what a worker
    assumes without them are left out (DEFAULT_VALUED_HEADERS).
    """
    headers, embed = _template()
    kwargs = {"message": message.payload}
    # The payload is small and flat; repr() says the same as Celery's saferepr at a fraction of the cost.
    headers = {**headers, "id": message.id, "kwargsrepr": repr(kwargs)[:_REPR_MAX]}
    if message.created_at is not None:
        headers[CREATED_AT_HEADER] = message.created_at.timestamp()
    if message.traceparent:
        headers[tracing.TRACEPARENT] = message.traceparent
        if message.tracestate:
            headers[tracing.TRACESTATE] = message.tracestate
    return amqp.Message(
        json.dumps([[], kwargs, embed]),
        content_type="application/json",
        content_encoding="utf-8",
        application_headers=headers,
        delivery_mode=2,
        message_id=message.id,
        correlation_id=message.id,
        reply_to="",
    )


@functools.cache
def _template() -> tuple[dict, dict]:
    """Return the award task's headers and body embed as Celery builds them, less the default-valued headers.

    Built once: only the task id and the payload (with its summary) change from one row to the next, and Celery's
    ``as_task_v2`` plus kombu's serializer registry per message made building one cost 24 us of CPU instead of 16
    (in process, docs/PERFORMANCE.md); outbox/tests/test_messages.py checks the result equals Celery's own message.
    """
    headers, properties, body, _ = app.amqp.as_task_v2(
        _TEMPLATE_ID, AWARD_CREDITS_TASK, args=(), kwargs={}, argsrepr="()", kwargsrepr="", origin=_ORIGIN
    )
    if properties != {"correlation_id": _TEMPLATE_ID, "reply_to": ""} or body[:2] != ((), {}):
        raise RuntimeError(f"Celery's task message changed shape: {properties}, {body}")
    for name in (*DEFAULT_VALUED_HEADERS, "id", "kwargsrepr"):
        del headers[name]
    return headers, body[2]
