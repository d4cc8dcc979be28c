"""The loopback listener testkit's TCP forwarders share (broker_proxy.py, silence.py, lost_answer.py): started on a
port with its accept loop in a thread of its own, and closed together with every connection it accepted."""

import contextlib
import socket
import threading
from collections.abc import Callable, Iterable


def listen(port: int, accept: Callable[[socket.socket], None], *, backlog: int, name: str) -> socket.socket:
    """Listen on 127.0.0.1:`port` and run `accept(listener)` in a daemon thread; return the listener."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(backlog)
    threading.Thread(target=accept, args=(listener,), name=name, daemon=True).start()
    return listener


def close(listener: socket.socket | None, sockets: Iterable[socket.socket]) -> None:
    """Stop listening and close every connection: the ends of each see it closed at once."""
    if listener is not None:
        # shutdown() wakes the thread blocked in accept(); close() alone would leave the port listening.
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
