"""This run's broker (CELERY_BROKER_URL): the app's queues declared and emptied around a cluster of processes, the
connections this process's Celery app keeps, and the server's own tool for what only it does (vhosts, stopping and
starting the broker)."""

import subprocess

from django.conf import settings
from kombu import Connection, pools

from config.celery import app


def purge_queues() -> None:
    """Declare every queue the app knows and drop the messages in it, so a run starts and ends with none."""
    with Connection(settings.CELERY_BROKER_URL) as conn:
        channel = conn.default_channel
        for queue in app.conf.task_queues:
            queue.bind(channel).declare()
            queue.bind(channel).purge()


def rabbitmqctl(*args: str) -> str:
    """Run rabbitmqctl against the system broker and return what it printed."""
    return subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, text=True, timeout=120).stdout


def broker_connections_drop() -> None:
    """Close every connection and producer this process's Celery app keeps in its pools; the next use opens anew."""
    # kombu keeps the pools in a registry, closed ones too: reset it, and forget the app's references to its pools
    # as Celery itself does after a fork (Celery._after_fork).
    pools.reset()
    app._pool = None
    app.amqp._producer_pool = None
