"""The publisher's reliance on an internal of py-amqp (pinned in requirements.txt): these fail when it changes."""

from unittest import mock

import amqp
import pytest
from celery import current_app as app

from outbox.claims import ClaimedMessage
from outbox.ids import new_transaction_id
from outbox.publisher import Publisher
from outbox.tests.support import make_payload


def claimed(n: int) -> list[ClaimedMessage]:
    ids = [new_transaction_id() for _ in range(n)]
    return [ClaimedMessage(id=tx, payload=make_payload(tx, order_id), attempts=0) for order_id, tx in enumerate(ids, 1)]


def socket_reads_while_sending(publisher: Publisher, messages: list[ClaimedMessage]) -> int:
    """Send a batch and return how often py-amqp read the socket while writing it; then collect the confirms."""
    connection = publisher._conn.connection
    with mock.patch.object(connection, "drain_events", wraps=connection.drain_events) as drain_events:
        batch = publisher.send(messages)
    result = publisher.wait(batch)
    assert batch.result.broker_error is None and len(result.confirmed) == len(messages), result
    return drain_events.call_count


@pytest.fixture
def publisher():
    publisher = Publisher()
    yield publisher
    publisher.close()


def test_py_amqp_negotiates_connection_blocked_where_the_publisher_looks_for_it():
    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=3)
        assert conn.connection.server_capabilities["connection.blocked"] is True
        assert conn.connection.client_properties["capabilities"]["connection.blocked"] is True


def test_the_publisher_writes_a_batch_without_reading_the_socket_before_each_message(credits_queue, publisher):
    publisher.connect()
    capabilities = publisher._conn.connection.client_properties["capabilities"]
    assert capabilities["connection.blocked"] is False

    assert socket_reads_while_sending(publisher, claimed(20)) == 0
    # With the capability left as negotiated, py-amqp reads before each publish: the switch still does something.
    capabilities["connection.blocked"] = True
    assert socket_reads_while_sending(publisher, claimed(20)) == 20
    assert credits_queue.wait_for(40) == 40


def test_connecting_fails_loudly_when_py_amqp_keeps_its_capabilities_elsewhere(publisher):
    with (
        mock.patch.object(amqp.Connection, "negotiate_capabilities", {}),
        pytest.raises(KeyError, match="capabilities"),
    ):
        publisher.connect()
    assert not publisher.connected


def test_the_publisher_writes_a_batch_to_the_socket_at_once(credits_queue, publisher):
    publisher.connect()
    transport = publisher._conn.connection.transport
    # TCPTransport writes every frame through its _write (the socket's sendall), where the publisher collects them.
    assert transport._write == transport.sock.sendall
    with mock.patch.object(transport, "_write", wraps=transport._write) as write:
        result = publisher.publish(claimed(5))
    assert len(result.confirmed) == 5 and result.broker_error is None, result
    assert write.call_count == 1
    assert credits_queue.wait_for(5) == 5


def test_a_batch_whose_write_fails_fails_every_message_and_reconnects_for_the_next(credits_queue, publisher):
    publisher.connect()
    transport = publisher._conn.connection.transport
    with mock.patch.object(transport, "_write", side_effect=ConnectionResetError("reset while writing")):
        result = publisher.publish(messages := claimed(3))
    assert set(result.failed) == {m.id for m in messages} and isinstance(result.broker_error, ConnectionResetError)
    assert not publisher.connected
    assert len(publisher.publish(claimed(2)).confirmed) == 2
