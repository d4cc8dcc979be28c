"""The app's queues on this run's broker (CELERY_BROKER_URL): declared and emptied around a cluster of processes."""

from django.conf import settings
from kombu import Connection

from config.celery import app


def purge_queues() -> None:
    """Declare every queue the app knows and drop the messages in it, so a run starts and ends with none."""
    with Connection(settings.CELERY_BROKER_URL) as conn:
        channel = conn.default_channel
        for queue in app.conf.task_queues:
            queue.bind(channel).declare()
            queue.bind(channel).purge()
