"""The award task's worker request decodes each message body once, runs the task with it, and hands the task the
message's own headers as Celery works them out (core/celery_request.py)."""

import json

from celery.app.task import Context
from celery.app.trace import trace_task_ret
from celery.utils.imports import symbol_by_name
from kombu import Message

import credits.tasks  # noqa: F401  (the requests below look the award task up in this process's registry)
from config.celery import app
from core.celery_request import DecodedOnceRequest
from core.contract import AWARD_CREDITS_TASK

BODY = [[], {"message": {"order_id": 7}}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]


def delivered(body: bytes) -> Message:
    return Message(
        body=body,
        content_type="application/json",
        content_encoding="utf-8",
        headers={"id": "t-1", "task": "probe"},
        properties={},
        delivery_info={"exchange": "credits", "routing_key": "credits"},
        channel=None,
    )


def test_the_award_task_uses_it():
    assert symbol_by_name(app.tasks[AWARD_CREDITS_TASK].Request) is DecodedOnceRequest


def test_the_run_gets_the_body_decoded_on_arrival_and_runs_the_task_with_its_arguments():
    ran = []

    @app.task(name="probe", bind=True, shared=False)
    def probe(self, message):
        ran.append((message, self.request.id))
        return "done"

    try:
        request = DecodedOnceRequest(delivered(json.dumps(BODY).encode()), app=app, task=probe)
        # What the worker passes to the task run: the decoded body, no content type to decode it again with.
        assert (request.body, request.content_type, request.content_encoding) == (BODY, None, None)
        assert (request.args, request.kwargs) == ([], {"message": {"order_id": 7}})

        failed, result, _ = trace_task_ret(
            "probe", request.id, request.request_dict, request.body, request.content_type,
            request.content_encoding, app=app,
        )  # fmt: skip
        assert (failed, result, ran) == (0, "'done'", [({"order_id": 7}, "t-1")])
    finally:
        app.tasks.pop("probe")


def test_a_request_celery_decoded_itself_is_left_as_it_is():
    # Celery converts older protocol versions itself and passes the body decoded: nothing to change then.
    request = DecodedOnceRequest(
        delivered(b"ignored"), app=app, task=app.tasks[AWARD_CREDITS_TASK], body=tuple(BODY), decoded=True,
        headers={"id": "t-2", "task": AWARD_CREDITS_TASK},
    )  # fmt: skip
    assert (request.body, request.content_type) == (tuple(BODY), None)


def test_the_task_sees_the_messages_own_headers_as_celery_works_them_out():
    message = delivered(json.dumps(BODY).encode())
    message.headers.update({"retries": 2, "argsrepr": "()", "created_at": 1.5, "traceparent": "00-ab-cd-01"})
    request = DecodedOnceRequest(message, app=app, task=app.tasks[AWARD_CREDITS_TASK])
    handed = request.request_dict
    celerys = {key: value for key, value in handed.items() if key != "headers"}

    assert handed["headers"] == {"created_at": 1.5, "traceparent": "00-ab-cd-01"}
    assert Context(handed, args=[], kwargs={}).headers == Context(celerys, args=[], kwargs={}).headers


def test_headers_a_message_names_itself_are_left_to_it():
    message = delivered(json.dumps(BODY).encode())
    message.headers.update({"headers": {"credits_first_failed_at": "2026-11-25T00:00:00+00:00"}, "created_at": 1.5})
    request = DecodedOnceRequest(message, app=app, task=app.tasks[AWARD_CREDITS_TASK])

    assert request.request_dict["headers"] == {"credits_first_failed_at": "2026-11-25T00:00:00+00:00"}
