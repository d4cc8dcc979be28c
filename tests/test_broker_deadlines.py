"""Every broker connection has deadlines, and a worker's control queue survives a reconnection the broker has not
noticed yet (docs/OPERATIONS.md, "When the broker goes silent"). Against the test run's RabbitMQ."""

import json
import os
import socket
import struct
import subprocess
import sys

import pytest
from amqp.exceptions import ResourceLocked
from kombu import Connection
from kombu.pidbox import Mailbox

from config.celery import (
    BROKER_CONNECT_TIMEOUT_SECONDS,
    BROKER_HEARTBEAT_SECONDS,
    BROKER_KEEPALIVE_IDLE_SECONDS,
    BROKER_SOCKET_TIMEOUT_SECONDS,
    app,
)
from outbox.loop import OUTAGE_BACKOFF_MAX_SECONDS
from outbox.publisher import Publisher
from outbox.wakeup import RelayWaker

RECOVERY_LIMIT_SECONDS = 15  # after the network heals (tests/reliability/test_silence_broker.py)


def socket_timeout(sock: socket.socket, option: int) -> float:
    seconds, microseconds = struct.unpack("ll", sock.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("ll")))
    return seconds + microseconds / 1e6


def test_a_workers_connection_negotiates_the_short_heartbeat_and_has_socket_deadlines():
    # As the consumer connects (celery/worker/consumer/consumer.py): the broker offers 60 s, the lower one wins.
    with app.connection_for_read(heartbeat=app.conf.broker_heartbeat) as conn:
        conn.connect()
        sock = conn.connection.sock
        assert conn.connection.heartbeat == BROKER_HEARTBEAT_SECONDS
        assert conn.connect_timeout == BROKER_CONNECT_TIMEOUT_SECONDS
        assert socket_timeout(sock, socket.SO_RCVTIMEO) == BROKER_SOCKET_TIMEOUT_SECONDS
        assert socket_timeout(sock, socket.SO_SNDTIMEO) == BROKER_SOCKET_TIMEOUT_SECONDS
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == BROKER_KEEPALIVE_IDLE_SECONDS
        # py-amqp's: what ends a connection whose writes (or keepalive probes) go unanswered, within about a second.
        assert 0 < sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) <= 5000


def test_the_relays_and_the_wakeups_connections_have_deadlines_and_keepalive():
    publisher = Publisher()
    publisher.connect()
    try:
        sock = publisher._conn.connection.sock
        assert socket_timeout(sock, socket.SO_RCVTIMEO) > 0
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == BROKER_KEEPALIVE_IDLE_SECONDS
    finally:
        publisher.close()
    waker = RelayWaker()
    waker._send()
    try:
        sock = waker._conn.connection.sock
        assert socket_timeout(sock, socket.SO_RCVTIMEO) > 0
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == BROKER_KEEPALIVE_IDLE_SECONDS
    finally:
        waker._drop_connection()


def test_the_relay_tries_the_broker_again_soon_enough_to_be_back_within_the_recovery_limit():
    # Worst case after a heal: a connection attempt that began just before it times out, then one backoff.
    assert Publisher().connect_timeout + OUTAGE_BACKOFF_MAX_SECONDS < RECOVERY_LIMIT_SECONDS


@pytest.mark.parametrize("exclusive", [True, False])
def test_a_workers_control_queue_can_be_taken_over_while_the_broker_holds_the_old_connection(exclusive):
    # The old connection stays open, as the broker keeps a silent one until its heartbeat deadline. Exclusive (Celery's
    # default) is what made a reconnecting worker exit: RESOURCE_LOCKED, which Celery's consumer does not retry.
    assert app.conf.control_queue_exclusive is False
    mailbox = Mailbox("celery", type="fanout", queue_exclusive=exclusive, queue_expires=app.conf.control_queue_expires)
    queue = mailbox.get_queue(f"deadlines-{exclusive}@{socket.gethostname()}")
    with Connection(app.conf.broker_url) as old, Connection(app.conf.broker_url) as new:
        old_queue = queue.bind(old.default_channel)
        old_queue.declare()
        old_queue.consume("old")
        if exclusive:
            with pytest.raises(ResourceLocked):
                queue.bind(new.default_channel).declare()
        else:
            new_queue = queue.bind(new.default_channel)
            new_queue.declare()
            new_queue.consume("new")


class RecordingConnection:
    """Stands in for the kombu connection a worker reconnects with: records how it was asked to retry."""

    def __init__(self):
        self.calls = []

    def ensure_connection(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self


def test_a_worker_retries_the_broker_forever_and_at_most_every_few_seconds():
    from core.worker import RECONNECT_INTERVAL_MAX_SECONDS, ClusterConsumer

    consumer = ClusterConsumer.__new__(ClusterConsumer)  # the reconnection alone, without a worker around it
    consumer.app, consumer.first_connection_attempt, consumer.broker_connection_retry_attempt = app, False, 0
    conn = RecordingConnection()

    ClusterConsumer.ensure_connected(consumer, conn)

    ((args, kwargs),) = conn.calls
    assert args[1] is None  # max_retries: forever (Celery's default gives up after 100 and exits)
    assert kwargs["interval_max"] == RECONNECT_INTERVAL_MAX_SECONDS < RECOVERY_LIMIT_SECONDS


BROKER_DEADLINE_VARIABLES = (
    "BROKER_HEARTBEAT_SECONDS",
    "BROKER_SOCKET_TIMEOUT_SECONDS",
    "BROKER_KEEPALIVE_IDLE_SECONDS",
)


def broker_deadlines_in_a_process(**env: str) -> list:
    """Return config/celery.py's heartbeat, socket timeout and keepalive idle as a process started with `env` reads
    them (without, whatever our own environment says)."""
    names = BROKER_DEADLINE_VARIABLES
    code = f"import json, config.celery as c; print(json.dumps([getattr(c, name) for name in {names}]))"
    environ = {k: v for k, v in os.environ.items() if k not in BROKER_DEADLINE_VARIABLES}
    result = subprocess.run([sys.executable, "-c", code], env={**environ, **env}, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_production_keeps_a_10_s_heartbeat_socket_timeout_and_keepalive_idle():
    assert broker_deadlines_in_a_process() == [10, 10.0, 10]


def test_a_test_cluster_can_shorten_the_broker_deadlines():
    shortened = dict(zip(BROKER_DEADLINE_VARIABLES, ("4", "3", "2"), strict=True))
    assert broker_deadlines_in_a_process(**shortened) == [4, 3.0, 2]
