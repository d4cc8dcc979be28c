"""A stand-in credits consumer for tests: a real Celery worker whose ``credits.award_credits`` records its argument.

Its own Celery app (not the project's), so it never collides with the real credits task. Started by tests as
``celery -A outbox.tests.probe_worker worker -Q credits``; PROBE_OUT names the file it appends to.
"""

import json
import os

from celery import Celery

from config.celery import app as project_app

app = Celery("probe")
app.conf.update(
    broker_url=os.environ["CELERY_BROKER_URL"],
    task_queues=project_app.conf.task_queues,
    accept_content=["json"],
    task_acks_late=True,
    worker_hijack_root_logger=False,
)


@app.task(name="credits.award_credits")
def award_credits(message: dict) -> None:
    with open(os.environ["PROBE_OUT"], "a") as out:
        out.write(json.dumps({"message": message, "task_id": award_credits.request.id}) + "\n")
