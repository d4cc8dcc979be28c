"""A TCP proxy in front of RabbitMQ that fails on demand, for tests of what a publisher or worker does in an outage.

It reads the AMQP frames it forwards, so a test can wait for the state it needs (a publish whose confirm the frozen
proxy holds back) rather than for a log line written before that state, or never once the client is stuck in it.
"""

import contextlib
import socket
import threading
import time

from testkit import listeners
from testkit.amqp_frames import BASIC_PUBLISH, CHANNEL_CLOSE, CONNECTION_CLOSE, Confirms, Method, MethodReader, NotAmqp
from testkit.processes import broker_url, free_port


class Link:
    """One proxied connection: its frames in each direction, its publishes still waiting for a confirm, and when the
    client began its goodbye (its first Channel.Close or Connection.Close)."""

    def __init__(self):
        self.amqp = True
        self.client_spoke = False
        self.goodbye_began: float | None = None
        self.confirms = Confirms()
        self._from_client = MethodReader(from_client=True)
        self._from_broker = MethodReader(from_client=False)

    def sent(self, data: bytes) -> int:
        """Read what the client sends the broker; return how many publishes it holds."""
        self.client_spoke = True
        published = 0
        for method in self._read(self._from_client, data):
            self.confirms.sent(method)
            published += method.method == BASIC_PUBLISH
            if method.method in (CHANNEL_CLOSE, CONNECTION_CLOSE) and self.goodbye_began is None:
                self.goodbye_began = time.monotonic()
        return published

    def delivered(self, data: bytes) -> None:
        """Read what the broker sends the client, as it is forwarded."""
        # An AMQP client speaks first; a server that greets first (MariaDB) is not a broker.
        self.amqp = self.amqp and self.client_spoke
        for method in self._read(self._from_broker, data):
            self.confirms.delivered(method)

    def _read(self, reader: MethodReader, data: bytes) -> list[Method]:
        if not self.amqp:
            return []
        try:
            return reader.feed(data)
        except NotAmqp:
            # Not a broker connection (the proxy also fronts MariaDB): forward it unread.
            self.amqp = False
            return []


class BrokerProxy:
    """A TCP proxy in front of RabbitMQ: `down()` refuses and cuts connections, `freeze()` withholds replies.

    With `freeze_at_publish=n` it freezes itself as it forwards the n-th publish, before the broker can confirm it.
    """

    def __init__(self, port: int, upstream=("127.0.0.1", 5672), *, freeze_at_publish: int | None = None):
        self.port = port
        self.upstream = upstream
        self.freeze_at_publish = freeze_at_publish
        self.frozen = threading.Event()
        self.publishes = 0
        # Per connection whose client said goodbye and then closed its socket: the seconds from its first Close to
        # the end of what it sent (how long the client gave the broker to answer).
        self.goodbyes: list[float] = []
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._links: set[Link] = set()
        # Held while a chunk is read and let through, and while freezing: once freeze() returns, every reply not
        # yet counted as delivered is held back.
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return broker_url(port=self.port)

    def freeze(self) -> None:
        """Withhold the broker's replies (confirms, heartbeats, answers) until thaw()."""
        with self._lock:
            self.frozen.set()

    def thaw(self) -> None:
        self.frozen.clear()

    def unconfirmed(self) -> int:
        """Return how many publishes on open connections wait for a confirm the client has not been given."""
        with self._lock:
            return sum(link.confirms.unconfirmed() for link in self._links)

    def up(self) -> None:
        self._listener = listeners.listen(self.port, self._accept, backlog=16, name=f"broker-proxy-{self.port}")

    def down(self) -> None:
        listener, self._listener = self._listener, None
        with self._lock:
            sockets, self._sockets = self._sockets, set()
            self._links.clear()
        listeners.close(listener, sockets)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            link = Link()
            with self._lock:
                self._sockets |= {client, server}
                self._links.add(link)
            threading.Thread(target=self._pump, args=(client, server, link, self._send, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, link, self._deliver, False), daemon=True).start()

    def _send(self, link: Link, data: bytes) -> None:
        with self._lock:
            self.publishes += (published := link.sent(data))
            if published and self.freeze_at_publish and self.publishes >= self.freeze_at_publish:
                self.frozen.set()

    def _deliver(self, link: Link, data: bytes) -> None:
        while True:
            with self._lock:
                if not self.frozen.is_set():
                    link.delivered(data)
                    return
            time.sleep(0.01)

    def _pump(self, src: socket.socket, dst: socket.socket, link: Link, let_through, from_client: bool) -> None:
        try:
            while data := src.recv(65536):
                let_through(link, data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            ended = time.monotonic()
            with self._lock:
                self._links.discard(link)
                if from_client and link.goodbye_began is not None:
                    self.goodbyes.append(ended - link.goodbye_began)
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


def closed_port_url() -> str:
    """A broker URL nothing listens on: connecting is refused at once."""
    return broker_url(port=free_port())
