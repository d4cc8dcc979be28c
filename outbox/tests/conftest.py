"""Fixtures for the outbox tests: outbox rows, the real RabbitMQ queues (purged), a TCP proxy that fails on demand."""

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from django.conf import settings
from kombu import Connection

from config.celery import app
from core.contract import CREDITS_QUEUE, OUTBOX_QUEUE
from outbox.ids import new_transaction_id
from outbox.models import TransactionLog
from outbox.tests.support import make_payload
from testkit.broker_proxy import BrokerProxy
from testkit.processes import free_port

# Ports for processes and proxies these tests start (this suite's share of the machine).


@pytest.fixture
def make_rows(db) -> Callable[..., list[str]]:
    """Insert `n` outbox rows (due now unless told otherwise) and return their ids in id order.

    Inside the test's transaction, unless the test is marked transactional (the relay claims and commits, so its
    tests are).
    """
    counter = iter(range(1, 10_000_000))

    def make(n: int, **fields) -> list[str]:
        rows = []
        for _ in range(n):
            order_id = next(counter)
            tx = new_transaction_id()
            rows.append(
                TransactionLog(
                    id=tx,
                    business="order",
                    foreign_key=str(order_id),
                    payload=make_payload(tx, order_id),
                    **fields,
                )
            )
        TransactionLog.objects.bulk_create(rows, batch_size=1000)
        return sorted(row.id for row in rows)

    return make


@dataclass
class QueueProbe:
    """Read what reached a real queue, the way any consumer would."""

    name: str
    channel: object

    def purge(self) -> None:
        self.channel.queue_purge(self.name)

    def count(self) -> int:
        return self.channel.queue_declare(self.name, passive=True).message_count

    def get_all(self) -> list:
        messages = []
        while (message := self.channel.basic_get(self.name, no_ack=True)) is not None:
            messages.append(message)
        return messages

    def ids(self) -> list[str]:
        return [message.properties["message_id"] for message in self.get_all()]

    def wait_for(self, n: int, timeout: float = 10.0) -> int:
        deadline = time.monotonic() + timeout
        while (count := self.count()) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        return count


@pytest.fixture
def broker():
    with Connection(settings.CELERY_BROKER_URL, connect_timeout=5) as conn:
        conn.ensure_connection(max_retries=3)
        yield conn


def _probe(broker, name: str):
    channel = broker.channel()
    app.amqp.queues[name](channel).declare()
    probe = QueueProbe(name, channel)
    probe.purge()
    return probe


@pytest.fixture
def credits_queue(broker):
    probe = _probe(broker, CREDITS_QUEUE)
    yield probe
    probe.purge()


@pytest.fixture
def outbox_queue(broker):
    probe = _probe(broker, OUTBOX_QUEUE)
    yield probe
    probe.purge()


@pytest.fixture
def broker_proxy():
    proxy = BrokerProxy(free_port())
    proxy.up()
    yield proxy
    proxy.thaw()
    proxy.down()


def task_body(message) -> list:
    return json.loads(message.body)
