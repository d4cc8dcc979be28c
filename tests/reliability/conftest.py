"""Fixtures for the fault-injection suite: a cluster of real processes on the test database and broker."""

import pytest
from django.conf import settings
from django.db import connection
from kombu import Connection

from config.celery import app
from tests.conftest import free_port
from tests.reliability.harness import Cluster, database_url


def purge_queues() -> None:
    with Connection(settings.CELERY_BROKER_URL) as conn:
        channel = conn.default_channel
        for queue in app.conf.task_queues:
            queue.bind(channel).declare()
            queue.bind(channel).purge()


@pytest.fixture
def cluster(transactional_db, tmp_path):
    purge_queues()
    cluster = Cluster(
        database_url=database_url(connection.settings_dict),
        broker_url=settings.CELERY_BROKER_URL,
        workdir=tmp_path,
        # Not the harness's fixed default: other test runs on this machine may hold it (their tokens would 401).
        port=free_port(),
    )
    try:
        yield cluster
    finally:
        cluster.stop()
        purge_queues()
