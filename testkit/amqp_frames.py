"""The AMQP 0-9-1 method frames in one direction of a connection, and which publishes still wait for their confirm.

For a proxy that must know what state a client is in (a publish sent, its confirm not yet delivered) instead of
guessing it from the client's log. Only the methods that matter for confirms are understood; a stream that is not
AMQP (the proxy also fronts MariaDB) raises NotAmqp on its first bytes.
"""

import struct
from dataclasses import dataclass

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
# type (1 octet), channel (2), payload size (4); the payload and a frame-end octet follow.
FRAME_HEADER = struct.Struct(">BHI")
FRAME_END = 0xCE
FRAME_METHOD = 1
# Method, content header, content body, heartbeat.
FRAME_TYPES = {1, 2, 3, 8}
METHOD_ID = struct.Struct(">HH")
# Basic.Ack and Basic.Nack from the broker: delivery tag (8 octets), then the bits, `multiple` the lowest.
CONFIRM_ARGUMENTS = struct.Struct(">QB")

# Connection.Close: the client's goodbye ends with it; Channel.Close may come first.
CONNECTION_CLOSE = (10, 50)
CHANNEL_OPEN = (20, 10)
CHANNEL_CLOSE = (20, 40)
CHANNEL_CLOSE_OK = (20, 41)
BASIC_PUBLISH = (60, 40)
BASIC_ACK = (60, 80)
BASIC_NACK = (60, 120)
CONFIRM_SELECT = (85, 10)


class NotAmqp(ValueError):
    """The stream is not AMQP 0-9-1 (or not a well-formed one)."""


@dataclass(frozen=True)
class Method:
    channel: int
    method: tuple[int, int]
    arguments: bytes


class MethodReader:
    """Split one direction of a connection into its method frames, whatever chunks the stream arrives in."""

    def __init__(self, *, from_client: bool):
        self._buffer = bytearray()
        # The client opens with the protocol header, which is not a frame.
        self._header_left = len(PROTOCOL_HEADER) if from_client else 0

    def feed(self, data: bytes) -> list[Method]:
        """Return the method frames completed by `data`; keep a frame cut short until the rest arrives."""
        self._buffer += data
        if self._header_left:
            seen = bytes(self._buffer[: self._header_left])
            expected = PROTOCOL_HEADER[len(PROTOCOL_HEADER) - self._header_left :]
            if not expected.startswith(seen):
                raise NotAmqp(f"does not open with the AMQP 0-9-1 header: {seen!r}")
            del self._buffer[: len(seen)]
            self._header_left -= len(seen)
        methods = []
        while len(self._buffer) >= FRAME_HEADER.size:
            if self._buffer.startswith(b"AMQP"):
                raise NotAmqp("the broker answered with its own protocol header (it refused this version)")
            kind, channel, size = FRAME_HEADER.unpack_from(self._buffer)
            if kind not in FRAME_TYPES:
                raise NotAmqp(f"no AMQP frame has type {kind}")
            end = FRAME_HEADER.size + size
            if len(self._buffer) <= end:
                break
            if self._buffer[end] != FRAME_END:
                raise NotAmqp(f"a frame of type {kind} and {size} octets does not end with 0xCE")
            if kind == FRAME_METHOD and size >= METHOD_ID.size:
                payload = self._buffer[FRAME_HEADER.size : end]
                methods.append(Method(channel, METHOD_ID.unpack_from(payload), bytes(payload[METHOD_ID.size :])))
            del self._buffer[: end + 1]
        return methods


class Confirms:
    """The publishes of one connection that wait for their confirm: sent by the client, not yet confirmed to it.

    A channel counts its publishes once the client put it in confirm mode (Confirm.Select); the broker's
    Basic.Ack or Basic.Nack names the publish by that count (its delivery tag), or all up to it when `multiple`.
    """

    def __init__(self):
        self._sent: dict[int, int] = {}
        self._waiting: dict[int, set[int]] = {}

    def sent(self, method: Method) -> None:
        """Note a method the client sent to the broker."""
        if method.method in (CHANNEL_OPEN, CHANNEL_CLOSE, CHANNEL_CLOSE_OK):
            self._sent.pop(method.channel, None)
            self._waiting.pop(method.channel, None)
        elif method.method == CONFIRM_SELECT:
            self._sent.setdefault(method.channel, 0)
            self._waiting.setdefault(method.channel, set())
        elif method.method == BASIC_PUBLISH and method.channel in self._sent:
            self._sent[method.channel] += 1
            self._waiting[method.channel].add(self._sent[method.channel])

    def delivered(self, method: Method) -> None:
        """Note a method of the broker's that reached the client."""
        if method.method == CHANNEL_CLOSE:
            self._sent.pop(method.channel, None)
            self._waiting.pop(method.channel, None)
        elif method.method in (BASIC_ACK, BASIC_NACK) and method.channel in self._waiting:
            tag, bits = CONFIRM_ARGUMENTS.unpack_from(method.arguments)
            waiting = self._waiting[method.channel]
            if bits & 1:
                waiting.difference_update({sent for sent in waiting if sent <= tag or tag == 0})
            else:
                waiting.discard(tag)

    def unconfirmed(self) -> int:
        return sum(len(waiting) for waiting in self._waiting.values())
