"""The task message the relay builds: Celery's protocol 2, without the headers that hold only Celery's defaults."""

import json
from datetime import UTC, datetime

from celery.app.task import Context
from celery.worker.request import Request
from kombu import Message

import credits.tasks  # noqa: F401  (the worker requests below look the award task up in this process's registry)
from config.celery import app
from core.contract import AWARD_CREDITS_TASK, CREATED_AT_HEADER
from outbox.claims import ClaimedMessage
from outbox.messages import DEFAULT_VALUED_HEADERS, build_task_message

TRANSACTION_ID = "01JCELERYHEADERS0000000000"
PAYLOAD = {"schema_version": 1, "transaction_id": TRANSACTION_ID, "order_id": 7, "user_id": 3, "total": 40}
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

# What Celery writes in each left-out header for a message like the relay's; each means the same as no header.
CELERY_WRITES = {
    "lang": "py",
    "shadow": None,
    "eta": None,
    "expires": None,
    "group": None,
    "group_index": None,
    "timelimit": [None, None],
    "root_id": TRANSACTION_ID,
    "parent_id": None,
    "ignore_result": False,
    "replaced_task_nesting": 0,
    "stamped_headers": None,
    "stamps": {},
}


def relay_message() -> ClaimedMessage:
    created_at = datetime(2026, 11, 25, tzinfo=UTC)
    return ClaimedMessage(
        id=TRANSACTION_ID, payload=PAYLOAD, attempts=0, created_at=created_at, traceparent=TRACEPARENT
    )


def celery_headers() -> dict:
    """The headers Celery itself writes for the relay's task, every one of them."""
    kwargs = {"message": PAYLOAD}
    headers, *_ = app.amqp.as_task_v2(TRANSACTION_ID, AWARD_CREDITS_TASK, args=(), kwargs=kwargs)
    return headers


def test_the_message_carries_the_task_its_summaries_and_the_outboxs_headers_only():
    headers = build_task_message(relay_message()).application_headers

    assert set(headers) == {
        "task",
        "id",
        "retries",
        "argsrepr",
        "kwargsrepr",
        "origin",
        CREATED_AT_HEADER,
        "traceparent",
    }
    assert (headers["task"], headers["id"], headers["retries"]) == (AWARD_CREDITS_TASK, TRANSACTION_ID, 0)


def test_the_left_out_headers_are_those_celery_fills_with_its_defaults():
    # Fails when a Celery upgrade writes something else in one of them: then leaving it out may change behaviour.
    headers = celery_headers()
    assert set(DEFAULT_VALUED_HEADERS) == set(CELERY_WRITES)
    assert {name: headers[name] for name in DEFAULT_VALUED_HEADERS} == CELERY_WRITES


def worker_request(headers: dict) -> Request:
    """The request a worker makes of a message with these headers (Celery's own class, as the worker uses it)."""
    message = build_task_message(relay_message())
    delivered = Message(
        body=message.body,
        content_type=message.content_type,
        content_encoding=message.content_encoding,
        headers=headers,
        properties={"correlation_id": TRANSACTION_ID},
        delivery_info={"exchange": "credits", "routing_key": "credits", "redelivered": False},
        channel=None,
    )
    return Request(delivered, app=app, task=app.tasks[AWARD_CREDITS_TASK])


def test_a_worker_runs_the_shorter_message_as_it_runs_celerys_own():
    short = worker_request(build_task_message(relay_message()).application_headers)
    full = worker_request({**celery_headers(), CREATED_AT_HEADER: 0.0, "traceparent": TRACEPARENT})

    for request in (short, full):
        assert (request.id, request.name, request.eta, request.expires) == (
            TRANSACTION_ID,
            AWARD_CREDITS_TASK,
            None,
            None,
        )
        assert request.time_limits in ((None, None), [None, None])
    # What the task sees as self.request, and what Celery derives from it when it publishes a retry.
    contexts = [Context(request.request_dict) for request in (short, full)]
    for context in contexts:
        assert context.retries == 0 and context.replaced_task_nesting == 0
        assert (context.root_id or context.id) == TRANSACTION_ID
        assert context.parent_id is None and context.group is None and context.group_index is None
        assert (context.timelimit or (None, None)) in ((None, None), [None, None])
        assert not context.stamps and not context.stamped_headers
    # No result is stored either way: the app has no result backend and ignores results by default.
    assert app.conf.task_ignore_result and app.conf.result_backend is None


def test_the_message_is_celerys_own_less_the_default_valued_headers():
    # The message is filled in from a template Celery built once; this is what Celery builds for the row itself.
    kwargs = {"message": PAYLOAD}
    headers, properties, body, _ = app.amqp.as_task_v2(
        TRANSACTION_ID, AWARD_CREDITS_TASK, args=(), kwargs=kwargs, argsrepr="()", kwargsrepr=repr(kwargs)
    )
    message = build_task_message(relay_message())

    expected = {name: value for name, value in headers.items() if name not in DEFAULT_VALUED_HEADERS}
    expected.update(origin=message.application_headers["origin"], traceparent=TRACEPARENT)
    expected[CREATED_AT_HEADER] = relay_message().created_at.timestamp()
    assert message.application_headers == expected
    assert {name: message.properties[name] for name in properties} == properties
    assert message.properties["message_id"] == TRANSACTION_ID
    assert (message.content_type, message.content_encoding) == ("application/json", "utf-8")
    assert json.loads(message.body) == json.loads(json.dumps(body))
