"""The test proxy in front of RabbitMQ counts the publishes it forwards, sees which still wait for their confirm, and
times a client's goodbye.

Tests wait on these counts for the state they need (tests/test_beat_stop.py), so they must be right however the
stream is cut into chunks, and whether a confirm names one publish or all up to it.
"""

import struct
import threading

from kombu import Connection

from testkit.amqp_frames import (
    BASIC_ACK,
    BASIC_NACK,
    BASIC_PUBLISH,
    CONFIRM_SELECT,
    PROTOCOL_HEADER,
    Confirms,
    MethodReader,
    NotAmqp,
)
from testkit.broker_proxy import BrokerProxy, Link
from testkit.processes import free_port
from testkit.waiting import wait_for


def frame(kind: int, channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", kind, channel, len(payload)) + payload + b"\xce"


def method(channel: int, method_id: tuple[int, int], arguments: bytes = b"") -> bytes:
    return frame(1, channel, struct.pack(">HH", *method_id) + arguments)


def confirm(channel: int, method_id: tuple[int, int], tag: int, *, multiple: bool = False) -> bytes:
    return method(channel, method_id, struct.pack(">QB", tag, multiple))


def publish(channel: int) -> bytes:
    """A publish as a client sends it: the method, the content header and a body frame."""
    arguments = b"\x00\x00\x00\x00\x00"  # ticket, empty exchange and routing key, no flags
    return method(channel, BASIC_PUBLISH, arguments) + frame(2, channel, b"\x00" * 14) + frame(3, channel, b"{}")


def test_frames_are_read_whatever_chunks_the_stream_comes_in():
    heartbeat = frame(8, 0, b"")
    stream = PROTOCOL_HEADER + method(1, CONFIRM_SELECT, b"\x00") + heartbeat + publish(1) + publish(1)
    whole = MethodReader(from_client=True).feed(stream)
    reader = MethodReader(from_client=True)

    bytewise = [found for i in range(len(stream)) for found in reader.feed(stream[i : i + 1])]

    assert [(m.channel, m.method) for m in whole] == [(1, CONFIRM_SELECT), (1, BASIC_PUBLISH), (1, BASIC_PUBLISH)]
    assert bytewise == whole


def test_a_stream_that_is_not_amqp_is_told_apart_at_once():
    mariadb_greeting = b"\x4a\x00\x00\x00\x0a11.4.5-MariaDB"

    for reader, data in (
        (MethodReader(from_client=True), b"\x20\x00\x00\x01\x85\xa6"),
        (MethodReader(from_client=False), mariadb_greeting),
        (MethodReader(from_client=False), frame(1, 0, b"\x00\x0a\x00\x0a")[:-1] + b"\x00"),
    ):
        try:
            reader.feed(data)
        except NotAmqp:
            continue
        raise AssertionError(f"read {data!r} as AMQP")


def test_a_confirm_answers_one_publish_or_every_one_up_to_its_tag():
    confirms = Confirms()
    reader = MethodReader(from_client=True)
    for sent in reader.feed(PROTOCOL_HEADER + method(1, CONFIRM_SELECT, b"\x00") + publish(1) * 4 + publish(2)):
        confirms.sent(sent)
    # Channel 2 is not in confirm mode: its publish waits for nothing.
    assert confirms.unconfirmed() == 4

    answers = MethodReader(from_client=False)
    for answer, left in (
        (confirm(1, BASIC_ACK, 2), 3),
        (confirm(1, BASIC_ACK, 3, multiple=True), 1),
        (confirm(1, BASIC_NACK, 4), 0),
    ):
        for delivered in answers.feed(answer):
            confirms.delivered(delivered)
        assert confirms.unconfirmed() == left


def test_the_proxy_forwards_a_server_that_speaks_first_unread():
    link = Link()

    link.delivered(b"\x4a\x00\x00\x00\x0a11.4.5-MariaDB" + b"\x00" * 64)
    link.sent(b"\x20\x00\x00\x01\x85\xa6")

    assert not link.amqp


def test_the_proxy_counts_a_real_clients_publishes_and_the_confirm_it_withholds():
    proxy = BrokerProxy(free_port())
    proxy.up()
    try:
        with Connection(proxy.url, transport_options={"confirm_publish": True}, connect_timeout=10) as connection:
            producer = connection.Producer()
            # The default exchange confirms a message no queue takes: nothing to declare or clean up.
            for _ in range(3):
                producer.publish({}, routing_key="test-broker-proxy-nowhere")
            assert (proxy.publishes, proxy.unconfirmed()) == (3, 0)

            proxy.freeze()
            held = threading.Thread(target=producer.publish, args=({},), kwargs={"routing_key": "nowhere"})
            held.start()
            wait_for(lambda: proxy.unconfirmed() == 1, timeout=60, what="the fourth publish to reach the proxy")
            held.join(timeout=0.5)
            assert held.is_alive(), "the publish returned without its confirm"

            proxy.thaw()
            held.join(timeout=60)
            assert not held.is_alive()
            assert (proxy.publishes, proxy.unconfirmed()) == (4, 0)
    finally:
        proxy.thaw()
        proxy.down()


def test_a_proxy_told_to_freezes_itself_as_it_forwards_that_publish():
    proxy = BrokerProxy(free_port(), freeze_at_publish=2)
    proxy.up()
    try:
        with Connection(proxy.url, transport_options={"confirm_publish": True}, connect_timeout=10) as connection:
            producer = connection.Producer()
            producer.publish({}, routing_key="test-broker-proxy-nowhere")
            assert not proxy.frozen.is_set()

            held = threading.Thread(target=producer.publish, args=({},), kwargs={"routing_key": "nowhere"})
            held.start()
            wait_for(lambda: proxy.unconfirmed() == 1, timeout=60, what="the second publish to reach the proxy")
            assert proxy.frozen.is_set()

            proxy.thaw()
            held.join(timeout=60)
            assert (proxy.publishes, proxy.unconfirmed(), held.is_alive()) == (2, 0, False)
    finally:
        proxy.thaw()
        proxy.down()


def test_the_proxy_times_a_clients_goodbye_from_its_first_close_to_its_sockets_end():
    proxy = BrokerProxy(free_port())
    proxy.up()
    try:
        dropped = Connection(proxy.url, connect_timeout=10)
        dropped.connect()
        dropped.connection.sock.close()  # gone without a Close: no goodbye to time (one is counted below)
        with Connection(proxy.url, connect_timeout=10) as connection:
            connection.connect()
            assert proxy.goodbyes == []
            proxy.freeze()
            # The broker's Close-Ok withheld: the client waits for it until its socket's timeout, then drops it.
            connection.connection.sock.settimeout(1.0)
            connection.release()
        wait_for(lambda: proxy.goodbyes, timeout=10, what="the goodbye's end")

        assert len(proxy.goodbyes) == 1 and 1.0 <= proxy.goodbyes[0] < 3.0, proxy.goodbyes
    finally:
        proxy.thaw()
        proxy.down()
