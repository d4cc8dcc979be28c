"""The writer endpoint's health check for a Galera cluster: one HTTP port per node answering 200 when that node may take
writes, 503 otherwise; haproxy polls it (scripts/mariadb_cluster.sh).

A node that accepts connections may still be no place to write: out of the primary component (its writes are refused
with "WSREP has not yet prepared node for application use"), joining, or a donor behind on its queue. So the check
reads the node's Galera state, and a node is healthy only when it is Synced (wsrep_local_state 4) and ready
(wsrep_ready ON). Each node has a connection of its own held open between checks, with one-second deadlines, so a
silent node fails its check within a second instead of holding it.

    galera_health.py LISTEN_HOST NODE_HOST:NODE_PORT:CHECK_PORT ...   (runs until SIGTERM)
"""

import contextlib
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import MySQLdb

SYNCED = "4"
DEADLINE_SECONDS = 1


class NodeState:
    """One node's Galera state, read over a connection kept open between checks."""

    def __init__(self, host: str, port: int):
        self.host = host
        self.port = port
        self._connection = None
        self._lock = threading.Lock()

    def read(self) -> tuple[bool, str]:
        """Return whether the node may take writes, and why."""
        with self._lock:
            try:
                status = self._status()
            except MySQLdb.Error as exc:
                self._close()
                return False, f"no answer: {exc.args[-1] if exc.args else exc}"
        state, ready = status.get("wsrep_local_state", "?"), status.get("wsrep_ready", "?")
        comment = status.get("wsrep_local_state_comment", "?")
        healthy = state == SYNCED and ready == "ON"
        return healthy, f"wsrep_local_state={state} ({comment}) wsrep_ready={ready}"

    def _status(self) -> dict[str, str]:
        if self._connection is None:
            self._connection = MySQLdb.connect(
                host=self.host,
                port=self.port,
                user="root",
                password="",
                connect_timeout=DEADLINE_SECONDS,
                read_timeout=DEADLINE_SECONDS,
                write_timeout=DEADLINE_SECONDS,
            )
        cursor = self._connection.cursor()
        cursor.execute(
            "SHOW GLOBAL STATUS WHERE Variable_name IN "
            "('wsrep_local_state', 'wsrep_local_state_comment', 'wsrep_ready')"
        )
        return dict(cursor.fetchall())

    def _close(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(MySQLdb.Error):
                self._connection.close()
            self._connection = None


def handler_for(node: NodeState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            healthy, reason = node.read()
            body = f"{reason}\n".encode()
            self.send_response(200 if healthy else 503)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format, *args) -> None:  # one line per check would flood the log
            pass

    return Handler


def main(argv: list[str]) -> None:
    listen_host, *nodes = argv
    servers = []
    for spec in nodes:
        host, port, check_port = spec.rsplit(":", 2)
        server = ThreadingHTTPServer((listen_host, int(check_port)), handler_for(NodeState(host, int(port))))
        server.daemon_threads = True
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    signal.signal(signal.SIGINT, lambda *_: stopped.set())
    stopped.wait()
    for server in servers:
        server.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
