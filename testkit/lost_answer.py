"""A COMMIT whose answer never comes back: a loopback TCP forwarder in front of a MariaDB server that, once armed,
lets a transaction's COMMIT through and drops the server's answer, or drops the COMMIT itself, then closes the client's
connection; a hook runs at that moment (SIGKILL the writer node, say). Or it holds the COMMIT while the hook runs
(another node commits the same rows, say) and then lets it and its answer through.

That is what a client sees when the server it writes to dies at commit time: a lost connection, and no way to tell
from it whether the transaction committed. The service's answer to that doubt is in the data (an order and its outbox
row commit together; an Idempotency-Key or an order id makes the retry find what did commit); the tests force both
outcomes with this.
"""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Callable

from testkit.listeners import close, listen
from testkit.processes import free_port

# A COMMIT statement, not READ COMMITTED (every connection sets its isolation level).
COMMIT = re.compile(rb"\bCOMMIT\b", re.IGNORECASE)
# Where the COMMIT goes: delivered and its answer dropped, dropped itself, or delivered after the hook returned.
ANSWER_LOST, COMMIT_LOST, COMMIT_HELD = "answer lost", "commit lost", "commit held"


class LostAnswerProxy:
    """Forward 127.0.0.1:port to `upstream`; `arm()` makes the next COMMIT lose its answer (or itself), or wait."""

    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self.port = free_port()
        self.fired = threading.Event()
        self._armed: tuple[str, Callable[[], None]] | None = None
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None

    def __enter__(self) -> LostAnswerProxy:
        self._listener = listen(self.port, self._accept, backlog=64, name="lost-answer-proxy")
        return self

    def __exit__(self, *exc) -> None:
        listener, self._listener = self._listener, None
        close(listener, ())

    def arm(self, mode: str, hook: Callable[[], None] = lambda: None) -> None:
        """Make the next statement containing COMMIT lose its answer (ANSWER_LOST) or itself (COMMIT_LOST), or wait
        for the hook before it goes on as usual (COMMIT_HELD)."""
        with self._lock:
            self._armed = (mode, hook)
            self.fired.clear()

    def _take(self, data: bytes) -> tuple[str, Callable[[], None]] | None:
        with self._lock:
            if self._armed is None or not COMMIT.search(data):
                return None
            armed, self._armed = self._armed, None
            return armed

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # closed by __exit__
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            pair = _Pair(client, server)
            threading.Thread(target=self._requests, args=(pair,), daemon=True).start()
            threading.Thread(target=self._answers, args=(pair,), daemon=True).start()

    def _requests(self, pair: _Pair) -> None:
        client, server = pair.client, pair.server
        try:
            while data := client.recv(65536):
                armed = self._take(data)
                if armed is None:
                    server.sendall(data)
                    continue
                mode, hook = armed
                if mode == COMMIT_HELD:
                    hook()
                    self.fired.set()
                    server.sendall(data)
                    continue
                if mode == COMMIT_LOST:
                    hook()
                    break
                # The server's answer to this, the next bytes it sends, is dropped by _answers.
                pair.swallow = True
                server.sendall(data)
                pair.answered.wait(timeout=30)
                hook()
                break
        except OSError:
            pass
        finally:
            self.fired.set()
            close(None, (client, server))

    def _answers(self, pair: _Pair) -> None:
        swallowed = b""
        try:
            while data := pair.server.recv(65536):
                if not pair.swallow:
                    pair.client.sendall(data)
                    continue
                # A batch is answered statement by statement: the answer is whole once its last result came (the
                # server goes on with a batch only while its connection is open).
                swallowed += data
                if answer_complete(swallowed):
                    return
        except OSError:
            pass
        finally:
            pair.answered.set()


class _Pair:
    """One client connection and its connection to the server."""

    def __init__(self, client: socket.socket, server: socket.socket):
        self.client, self.server = client, server
        # Set before a COMMIT is forwarded whose answer is to be dropped; `answered` once it came (or never will).
        self.swallow = False
        self.answered = threading.Event()


SERVER_MORE_RESULTS_EXISTS = 0x0008


def _length_encoded(payload: bytes, at: int) -> tuple[int, int]:
    """Return a length-encoded integer of the MySQL protocol at `at`, and where the next field begins."""
    first = payload[at]
    if first < 0xFB:
        return first, at + 1
    size = {0xFC: 2, 0xFD: 3, 0xFE: 8}[first]
    return int.from_bytes(payload[at + 1 : at + 1 + size], "little"), at + 1 + size


def answer_complete(data: bytes) -> bool:
    """Return whether `data`, the server's packets answering one statement or batch of statements without result
    sets, ends with its last OK packet (no more results announced) or an error packet."""
    at = 0
    while at + 4 <= len(data):
        length = int.from_bytes(data[at : at + 3], "little")
        payload = data[at + 4 : at + 4 + length]
        if len(payload) < length:
            return False
        at += 4 + length
        if payload[:1] == b"\xff":
            return True
        if payload[:1] == b"\x00":
            _, after = _length_encoded(payload, 1)
            _, after = _length_encoded(payload, after)
            status = int.from_bytes(payload[after : after + 2], "little")
            if not status & SERVER_MORE_RESULTS_EXISTS:
                return True
    return False
