"""Publishing batches to RabbitMQ on one confirm-mode connection: write a batch, then wait once for its confirms.

Every message of a batch is written to the channel without waiting, then one wait collects the broker's basic.ack /
basic.nack by delivery tag: one round trip per batch, not per message. Each message goes to the queue of its schema
version (core/credits_queues.py), declared on the connection before the first message for it.
"""

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from celery import current_app as app
from django.conf import settings
from kombu import Queue

from core import tracing
from core.broker import BROKER_ERRORS, close_connection, connection_ensure
from core.contract import CREDITS_DEAD_QUEUE, CREDITS_EXPIRED_QUEUE, CREDITS_QUEUE, credits_queue_name
from core.credits_queues import queue_for, wait_expiration_seconds
from outbox.claims import ClaimedMessage
from outbox.messages import build_task_message


@dataclass
class PublishResult:
    confirmed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    # Set when the connection failed or a confirm did not come in time; the relay should back off.
    broker_error: BaseException | None = None


class ConfirmTimeout(TimeoutError):
    """The broker did not confirm every message of a batch within the confirm timeout."""


@dataclass
class PendingBatch:
    """A batch written to the channel whose confirms are still coming in; `result` fills as they arrive."""

    result: PublishResult = field(default_factory=PublishResult)
    unsettled: int = 0


class Publisher:
    """One broker connection in confirm mode: writes a batch without waiting, then waits once for its confirms.

    ``send`` and ``wait`` are separate so a relay can write the next batch while the previous one's confirms arrive;
    ``publish`` is both. Not thread-safe: each relay thread or process has its own.
    """

    def __init__(
        self,
        *,
        url: str | None = None,
        queue: Queue | None = None,
        confirm_timeout: float | None = None,
        connect_timeout: float = 5.0,
    ):
        self.url = url
        self.queue = queue
        self.confirm_timeout = confirm_timeout
        self.connect_timeout = connect_timeout
        self._conn = None
        self._channel = None
        self._next_tag = 0
        # Delivery tag -> (message id, its batch), in tag order (dicts keep insertion order).
        self._unconfirmed: dict[int, tuple[str, PendingBatch]] = {}
        self._returned: dict[str, str] = {}
        # Queue name -> the time to live its messages get ("" for none), for each queue declared on this connection.
        self._routes: dict[str, str] = {}

    @property
    def connected(self) -> bool:
        return self._conn is not None

    def connect(self) -> None:
        """Open the connection and a confirm-mode channel, and declare the destination queue; no-op if open."""
        if self._conn is not None:
            return
        # confirm_publish off: that option makes py-amqp wait for each message's confirm; we wait once per batch.
        # Socket read/write timeouts bound the waits py-amqp does without one (channel open, declare, close, writes).
        socket_timeout = self.connect_timeout + self._confirm_timeout()
        conn = app.connection_for_write(
            url=self.url,
            connect_timeout=self.connect_timeout,
            heartbeat=0,
            transport_options={
                "confirm_publish": False,
                "read_timeout": socket_timeout,
                "write_timeout": socket_timeout,
            },
        )
        try:
            connection_ensure(conn)
            channel = conn.channel()
            for queue in self._queues_to_declare():
                queue(channel).declare()
            channel.confirm_select()
            # py-amqp polls the socket before every publish when connection.blocked was negotiated, to notice the
            # broker's flow control early; a fifth of the relay's CPU per message. We read once per batch anyway
            # (the confirm wait, where a connection.blocked frame is still handled), and a blocked broker stalls our
            # writes into the socket's write timeout. The broker is not told anything different.
            # This is py-amqp's internal (amqp is pinned in requirements.txt): indexed, not .get(), so a version
            # that stores it elsewhere fails here with a KeyError instead of silently polling again
            # (outbox/tests/test_publisher.py checks it still works).
            capabilities = conn.connection.client_properties["capabilities"]
            if capabilities["connection.blocked"]:
                capabilities["connection.blocked"] = False
        except BaseException:
            close_connection(conn, graceful=False)
            raise
        channel.events["basic_ack"].add(self._on_ack)
        channel.events["basic_nack"].add(self._on_nack)
        channel.events["basic_return"].add(self._on_return)
        self._conn, self._channel, self._next_tag = conn, channel, 0
        self._routes = {CREDITS_QUEUE: ""} if self.queue is None else {self.queue.name: _ttl(self.queue.name)}

    def close(self, *, graceful: bool = True) -> None:
        """Drop the connection; the next publish reconnects. After an error, drop it without the close handshake."""
        conn, self._conn, self._channel = self._conn, None, None
        self._unconfirmed.clear()
        self._returned.clear()
        if conn is not None:
            close_connection(conn, graceful=graceful)

    def publish(self, messages: Sequence[ClaimedMessage]) -> PublishResult:
        """Publish every message, then collect the confirms; never raises broker errors."""
        return self.wait(self.send(messages))

    def send(self, messages: Sequence[ClaimedMessage]) -> PendingBatch:
        """Write every message to the channel (mandatory routing) without waiting for any confirm.

        The batch's span links to each message's trace: one batch carries many orders' traces, and none is its parent.
        """
        with tracing.span(
            f"{self._queue().name} publish",
            kind=tracing.SpanKind.PRODUCER,
            attributes={"messaging.system": "rabbitmq", "messaging.batch.message_count": len(messages)},
            linked_to=[(message.traceparent, message.tracestate) for message in messages]
            if tracing.tracing_enabled()
            else (),
        ):
            return self._send(messages)

    def _send(self, messages: Sequence[ClaimedMessage]) -> PendingBatch:
        batch = PendingBatch()
        built = []
        for message in messages:
            try:
                name = self.queue.name if self.queue is not None else _queue_name(message)
                built.append((message.id, build_task_message(message), name))
            except (TypeError, ValueError) as exc:
                batch.result.failed[message.id] = f"cannot build the task message: {exc}"
        sent = 0
        try:
            self.connect()
            queue = self._queue()
            exchange, routing_key = queue.exchange.name, queue.routing_key
            routed = self.queue is None
            for _, _, name in built:
                if name not in self._routes:
                    self._route_declare(name)
            with self._one_write():
                for message_id, amqp_message, name in built:
                    if routed:
                        routing_key = name
                    if expiration := self._routes[name]:
                        amqp_message.properties["expiration"] = expiration
                    self._next_tag += 1
                    self._unconfirmed[self._next_tag] = (message_id, batch)
                    batch.unsettled += 1
                    sent += 1
                    # mandatory: an unroutable message is returned (then acked) instead of vanishing silently.
                    self._channel.basic_publish(
                        amqp_message, exchange=exchange, routing_key=routing_key, mandatory=True
                    )
        except BROKER_ERRORS as exc:
            self._fail_in_flight(exc)
            for message_id, _, _ in built[sent:]:
                batch.result.failed[message_id] = _reason(exc)
            batch.result.broker_error = exc
        return batch

    @contextlib.contextmanager
    def _one_write(self):
        """Collect the frames py-amqp writes in the block, then write them to the socket at once.

        py-amqp writes each message with its own sendall: a system call per message in the relay, and a read per
        message in the broker. With the batch written at once and the message built from a template
        (outbox/messages.py), publishing cost 32 us of relay CPU per message instead of 50 (in process, batches of
        100, docs/PERFORMANCE.md); the template accounts for about 8 of the 18. The frames are copied: py-amqp hands
        over a view of a buffer it reuses. This is py-amqp's internal (amqp is pinned in requirements.txt):
        TCPTransport keeps its socket's sendall as ``_write``, called by ``write`` for every frame
        (outbox/tests/test_publisher.py checks a batch is one write). No per-call timeout: the socket's write timeout
        (see connect) bounds the write to a stalled broker.
        """
        transport = self._conn.connection.transport
        frames: list[bytes] = []
        write = transport._write
        transport._write = lambda frame: frames.append(bytes(frame))
        try:
            yield
        finally:
            transport._write = write
        if frames:
            transport.write(b"".join(frames))

    def wait(self, batch: PendingBatch) -> PublishResult:
        """Collect confirms until every message of `batch` is acked or nacked, or the confirm timeout passes."""
        timeout = self._confirm_timeout()
        deadline = time.monotonic() + timeout
        try:
            while batch.unsettled > 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ConfirmTimeout(f"no publisher confirm within {timeout:g} s")
                try:
                    self._conn.drain_events(timeout=remaining)
                except TimeoutError as exc:
                    if exc.errno is not None:  # the kernel gave the connection up (ETIMEDOUT): not the wait's timeout
                        raise
                    raise ConfirmTimeout(f"no publisher confirm within {timeout:g} s") from None
        except (*BROKER_ERRORS, ConfirmTimeout) as exc:
            self._fail_in_flight(exc)
        return batch.result

    def _fail_in_flight(self, exc: BaseException) -> None:
        """Fail every unconfirmed message of every batch and drop the connection, whose tags no longer add up."""
        for message_id, batch in self._unconfirmed.values():
            batch.result.failed[message_id] = _reason(exc)
            batch.result.broker_error = exc
            batch.unsettled -= 1
        self.close(graceful=False)

    def _queues_to_declare(self) -> list[Queue]:
        if self.queue is not None:
            return [self.queue]
        # The consumer may not have started yet; declaring here keeps the first messages from being unroutable.
        # credits.expired before any version's queue, which dead-letters into it.
        return [app.amqp.queues[name] for name in (CREDITS_QUEUE, CREDITS_DEAD_QUEUE, CREDITS_EXPIRED_QUEUE)]

    def _route_declare(self, name: str) -> None:
        """Declare a version's queue (durable, bound under its name) the first time this connection routes to it.

        Declared by the relay, a version's queue holds its messages while no consumer of that version runs yet.
        """
        queue_for(name)(self._channel).declare()
        self._routes[name] = _ttl(name)

    def _queue(self) -> Queue:
        return self.queue if self.queue is not None else app.amqp.queues[CREDITS_QUEUE]

    def _confirm_timeout(self) -> float:
        return self.confirm_timeout or settings.OUTBOX_CONFIRM_TIMEOUT_SECONDS

    def _on_ack(self, delivery_tag: int, multiple: bool) -> None:
        self._settle(delivery_tag, multiple, None)

    def _on_nack(self, delivery_tag: int, multiple: bool) -> None:
        self._settle(delivery_tag, multiple, "nacked by the broker")

    def _on_return(self, exc, exchange: str, routing_key: str, message) -> None:
        message_id = message.properties.get("message_id")
        if message_id:
            self._returned[message_id] = f"unroutable ({exchange!r}, {routing_key!r}): {exc}"

    def _settle(self, delivery_tag: int, multiple: bool, error: str | None) -> None:
        if not multiple:
            self._settle_one(delivery_tag, error)
            return
        while self._unconfirmed:
            tag = next(iter(self._unconfirmed))
            if tag > delivery_tag:
                break
            self._settle_one(tag, error)

    def _settle_one(self, tag: int, error: str | None) -> None:
        entry = self._unconfirmed.pop(tag, None)
        if entry is None:
            return
        message_id, batch = entry
        batch.unsettled -= 1
        error = error or self._returned.pop(message_id, None)
        if error:
            batch.result.failed[message_id] = error
        else:
            batch.result.confirmed.append(message_id)


def _ttl(name: str) -> str:
    """Return the AMQP expiration (milliseconds, as text) of a message published to this queue, "" for none."""
    seconds = wait_expiration_seconds(name)
    return "" if seconds is None else str(round(seconds * 1000))


def _queue_name(message: ClaimedMessage) -> str:
    payload = message.payload
    return credits_queue_name(payload.get("schema_version") if isinstance(payload, dict) else None)


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
