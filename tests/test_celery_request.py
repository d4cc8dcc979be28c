"""The award task's worker request decodes each message body once and runs the task with it (core/celery_request.py)."""

import json

from celery.app.trace import trace_task_ret
from celery.utils.imports import symbol_by_name
from kombu import Message

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
