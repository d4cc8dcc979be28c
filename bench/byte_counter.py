"""A TCP relay in front of the database server that counts the bytes its clients receive.

The analytics benchmark points a run's read URLs (ANALYTICS_ORDERS_READ_URL, ANALYTICS_CREDITS_READ_URL) at it, so
every byte the run reads from the databases, over JDBC or through Django, crosses it and is counted, while its
writes go to the primary directly; the SQL baseline's URLs point at it the same way. MariaDB's own counters
(`Bytes_sent`) are per session or per server, and a server shared with other clients would mix theirs in.
"""

import contextlib
import socket
import threading
from contextlib import ExitStack
from urllib.parse import urlsplit, urlunsplit

from testkit.listeners import close, listen

CHUNK = 1 << 20


class ByteCounter:
    """Listen on 127.0.0.1, relay each connection to (host, port), count the bytes each way."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._lock = threading.Lock()
        self.received = 0  # server to client
        self.sent = 0  # client to server
        self._threads: list[threading.Thread] = []
        self._sockets: list[socket.socket] = []
        # The listener testkit's forwarders share: its accept loop on a thread, closed with every connection.
        self._listener = listen(0, self._accept, backlog=64, name="byte-counter")
        self.port = self._listener.getsockname()[1]

    def url(self, database_url: str) -> str:
        """The same mysql:// URL (user, password, database), through this relay."""
        parts = urlsplit(database_url)
        credentials = parts.netloc.rpartition("@")[0]
        netloc = f"{credentials}@127.0.0.1:{self.port}" if credentials else f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    def __enter__(self) -> "ByteCounter":
        return self

    def __exit__(self, *exc) -> None:
        close(self._listener, list(self._sockets))
        for thread in list(self._threads):
            thread.join(timeout=5)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._target)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sockets += [client, server]
            for source, target, downstream in ((server, client, True), (client, server, False)):
                thread = threading.Thread(target=self._pump, args=(source, target, downstream), daemon=True)
                self._threads.append(thread)
                thread.start()

    def _pump(self, source: socket.socket, target: socket.socket, downstream: bool) -> None:
        buffer = bytearray(CHUNK)
        view = memoryview(buffer)
        try:
            while n := source.recv_into(buffer):
                # Counted before it is passed on: whatever the client has read is in the count by then.
                with self._lock:
                    if downstream:
                        self.received += n
                    else:
                        self.sent += n
                target.sendall(view[:n])
        except OSError:
            pass
        finally:
            # The other direction ends when its peer sees this one close.
            for sock in (source, target):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


class Relays:
    """A relay per service database (Django's aliases `default` and `credits`), each in front of its server."""

    def __init__(self, connections) -> None:
        self._stack = ExitStack()
        self.counters = {}
        for alias in ("default", "credits"):
            database = connections[alias].settings_dict
            self.counters[alias] = ByteCounter(database["HOST"] or "127.0.0.1", int(database["PORT"] or 3306))

    def __enter__(self) -> "Relays":
        for counter in self.counters.values():
            self._stack.enter_context(counter)
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def url(self, alias: str, database_url: str) -> str:
        return self.counters[alias].url(database_url)

    @property
    def received(self) -> int:
        return sum(counter.received for counter in self.counters.values())
