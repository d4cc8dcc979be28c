"""The silence fault helper drops a link's packets both ways without a reset, and lets them through again."""

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from testkit.silence import SilentLink, drop_leftover_rules, iptables_available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not iptables_available(), reason="needs iptables and root (scripts/setup.sh)"),
]


@pytest.fixture
def echo_server():
    """A TCP server on a free port that echoes what it reads."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)
    yield listener
    listener.close()


def echo_once(listener: socket.socket) -> None:
    conn, _ = listener.accept()
    with conn:
        while data := conn.recv(1024):
            conn.sendall(data)


def test_an_open_connection_hangs_while_silent_and_resumes_after_the_heal(echo_server):
    threading.Thread(target=echo_once, args=(echo_server,), daemon=True).start()
    with SilentLink(echo_server.getsockname()) as link:
        client = socket.create_connection(("127.0.0.1", link.port), timeout=2)
        client.sendall(b"ping")
        assert client.recv(4) == b"ping"
        link.silence()
        client.settimeout(1)
        client.sendall(b"held")
        started = time.monotonic()
        with pytest.raises(TimeoutError):  # neither an answer nor a reset: silence
            client.recv(4)
        assert time.monotonic() - started >= 0.9
        link.heal()
        client.settimeout(10)
        # The held bytes are retransmitted once the packets pass again, as after a real partition.
        assert client.recv(4) == b"held"
        client.close()


def test_a_new_connection_is_neither_accepted_nor_refused_while_silent(echo_server):
    with SilentLink(echo_server.getsockname()) as link:
        link.silence()
        with pytest.raises(TimeoutError):
            socket.create_connection(("127.0.0.1", link.port), timeout=1)
        link.heal()
        socket.create_connection(("127.0.0.1", link.port), timeout=2).close()


def test_leftover_rules_of_a_dead_process_are_dropped_and_a_live_ones_kept(echo_server):
    live = SilentLink(echo_server.getsockname())
    live.silence()
    # A run killed mid-silence leaves its rules: made here by a child process that then exits without healing.
    dead_port = SilentLink(echo_server.getsockname()).port
    subprocess.run(
        [
            sys.executable,
            "-c",
            f"from testkit.silence import _iptables, _rules\nfor r in _rules({dead_port}): _iptables('-I', *r)",
        ],
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert drop_leftover_rules() == 2
        rules = subprocess.run(["iptables", "-w", "-S", "INPUT"], capture_output=True, text=True, check=True).stdout
        assert str(dead_port) not in rules
        assert rules.count(f"-{live.port}-pid") == 2  # another run's silence is left alone
    finally:
        live.heal()
