"""A COMMIT whose answer never comes back: a loopback TCP forwarder in front of a MariaDB server that, once armed,
lets a transaction's COMMIT through and drops the server's answer, or drops the COMMIT itself, then closes the client's
connection; a hook runs at that moment (SIGKILL the writer node, say).

That is what a client sees when the server it writes to dies at commit time: a lost connection, and no way to tell
from it whether the transaction committed. The service's answer to that doubt is in the data (an order and its outbox
row commit together; an Idempotency-Key or an order id makes the retry find what did commit); the tests force both
outcomes with this.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

from testkit.processes import free_port

COMMIT = b"COMMIT"
# Where the COMMIT goes: delivered and its answer dropped, or dropped itself.
ANSWER_LOST, COMMIT_LOST = "answer lost", "commit lost"


class LostAnswerProxy:
    """Forward 127.0.0.1:port to `upstream`; `arm()` makes the next COMMIT lose its answer (or itself)."""

    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self.port = free_port()
        self.fired = threading.Event()
        self._armed: tuple[str, Callable[[], None]] | None = None
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None

    def __enter__(self) -> LostAnswerProxy:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()

    def arm(self, mode: str, hook: Callable[[], None] = lambda: None) -> None:
        """Make the next statement containing COMMIT lose its answer (ANSWER_LOST) or itself (COMMIT_LOST)."""
        with self._lock:
            self._armed = (mode, hook)
            self.fired.clear()

    def _take(self, data: bytes) -> tuple[str, Callable[[], None]] | None:
        with self._lock:
            if self._armed is None or COMMIT not in data.upper():
                return None
            armed, self._armed = self._armed, None
            return armed

    def _accept(self) -> None:
        while (listener := self._listener) is not None:
            try:
                client, _ = listener.accept()
            except OSError:
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
            _close(client, server)

    def _answers(self, pair: _Pair) -> None:
        try:
            while data := pair.server.recv(65536):
                if pair.swallow:
                    pair.answered.set()
                    return
                pair.client.sendall(data)
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


def _close(*sockets: socket.socket) -> None:
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
