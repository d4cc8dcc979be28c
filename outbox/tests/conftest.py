"""Fixtures for the outbox tests: outbox rows, the real RabbitMQ queues (purged), a TCP proxy that fails on demand."""

import contextlib
import json
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.conf import settings
from kombu import Connection

from config.celery import app
from core.contract import CREDITS_QUEUE, OUTBOX_QUEUE
from outbox.ids import new_transaction_id
from outbox.models import TransactionLog
from tests.processes import broker_url, free_port

BASE_DIR = Path(settings.BASE_DIR)
# Ports for processes and proxies these tests start (this suite's share of the machine).
PROXY_PORTS = iter(range(18300, 18350))


def make_payload(transaction_id: str, order_id: int) -> dict:
    return {"schema_version": 1, "transaction_id": transaction_id, "order_id": order_id, "user_id": 7, "total": 3}


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


class BrokerProxy:
    """A TCP proxy in front of RabbitMQ: `down()` refuses and cuts connections, `freeze()` withholds replies."""

    def __init__(self, port: int, upstream=("127.0.0.1", 5672)):
        self.port = port
        self.upstream = upstream
        self.frozen = threading.Event()
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return broker_url(port=self.port)

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            # shutdown() wakes the thread blocked in accept(); close() alone would leave the port listening.
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            with self._lock:
                self._sockets |= {client, server}
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        try:
            while data := src.recv(65536):
                while replies and self.frozen.is_set():
                    time.sleep(0.01)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def broker_proxy():
    proxy = BrokerProxy(next(PROXY_PORTS))
    proxy.up()
    yield proxy
    proxy.frozen.clear()
    proxy.down()


def closed_port_url() -> str:
    """A broker URL nothing listens on: connecting is refused at once."""
    return broker_url(port=free_port())


PYTHON = sys.executable


def task_body(message) -> list:
    return json.loads(message.body)
