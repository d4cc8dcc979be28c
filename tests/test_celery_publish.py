"""A task message published by this app carries no time limits: the worker that runs it applies its own."""

import uuid

from django.conf import settings
from kombu import Connection, Exchange, Queue

import analytics.tasks  # noqa: F401  (registers the nightly task in this process)
import credits.tasks  # noqa: F401  (registers the award task)
from config.celery import app
from core.contract import AWARD_CREDITS_TASK, RUN_NIGHTLY_TASK
from testkit.waiting import wait_for


def published_headers(task_name: str, **options) -> dict:
    """Publish a task with Celery's send_task to a queue of its own and return the headers the broker delivers."""
    name = f"test.publish.{uuid.uuid4().hex}"
    queue = Queue(name, Exchange(name, type="direct"), routing_key=name, auto_delete=True)
    with Connection(settings.CELERY_BROKER_URL) as connection:
        bound = queue(connection.channel())
        bound.declare()
        try:
            app.send_task(task_name, kwargs={}, exchange=name, routing_key=name, **options)
            message = wait_for(lambda: bound.get(no_ack=True), what="the published message in its queue", interval=0.05)
            return message.headers
        finally:
            bound.delete()


def test_a_registered_tasks_message_leaves_its_limits_to_the_worker():
    # Registered in this process, with limits from the settings (CELERY_TASK_* and the nightly's annotations):
    # Celery would stamp them into the message.
    assert app.tasks[AWARD_CREDITS_TASK].time_limit == settings.CELERY_TASK_TIME_LIMIT
    assert app.tasks[RUN_NIGHTLY_TASK].time_limit == settings.ANALYTICS_RUN_TIMEOUT_SECONDS + 120

    for task_name in (AWARD_CREDITS_TASK, RUN_NIGHTLY_TASK):
        headers = published_headers(task_name)
        assert headers["task"] == task_name
        assert "timelimit" not in headers


def test_limits_given_at_the_call_are_left_out_too():
    headers = published_headers(AWARD_CREDITS_TASK, time_limit=5, soft_time_limit=4)

    assert "timelimit" not in headers
