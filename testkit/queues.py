"""This run's broker (CELERY_BROKER_URL): the app's queues declared and emptied around a cluster of processes, and the
server's own tool for what only it does (vhosts)."""

import subprocess

from django.conf import settings
from kombu import Connection

from config.celery import app


def purge_queues(broker_url: str | None = None) -> None:
    """Declare every queue the app knows and drop the messages in it, so a run starts and ends with none; on this
    run's broker, or the one `broker_url` names."""
    with Connection(broker_url or settings.CELERY_BROKER_URL) as conn:
        channel = conn.default_channel
        for queue in app.conf.task_queues:
            queue.bind(channel).declare()
            queue.bind(channel).purge()


def rabbitmqctl(*args: str) -> str:
    """Run rabbitmqctl against the system broker and return what it printed."""
    return subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, text=True, timeout=120).stdout
