"""A dependency that goes silent: its packets dropped both ways, no reset, no close, until the network heals.

The fault networks make most often is not a refused or reset connection but silence: a switch, a firewall or a cloud
network drops packets and tells no one, so every socket in flight waits. `SilentLink` puts a TCP forwarder on a
loopback port of its own in front of one dependency (MariaDB, RabbitMQ, Redis); the processes under test are given
that port. `silence()` drops every packet to and from the forwarder's port with iptables (needs root and the iptables
package: scripts/setup.sh installs it), so connections already open hang exactly as they would behind a dead switch
(keepalives and retransmissions unanswered) and new ones never get past SYN; everything else on the machine,
the test run's own connections included, is untouched. `heal()` lets the packets through again: connections still
open resume where they were, as after a real partition.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from testkit import listeners
from testkit.processes import free_port

IPTABLES = "iptables"
# Every rule this module inserts carries this comment, so a run that died mid-silence can be cleaned up by name.
RULE_TAG = "creditshop-silence"


def iptables_available() -> bool:
    """Return whether iptables can drop packets here (installed, and this process may change the rules)."""
    if shutil.which(IPTABLES) is None:
        return False
    return subprocess.run([IPTABLES, "-w", "-S", "INPUT"], capture_output=True).returncode == 0


def _rules(port: int) -> list[list[str]]:
    """Return the INPUT rules that drop the forwarder's traffic on loopback: to its port, and from it.

    Their comment names the process that made them, so a cleanup never lifts another live run's silence.
    """
    comment = ["-m", "comment", "--comment", f"{RULE_TAG}-{port}-pid{os.getpid()}"]
    return [
        ["INPUT", "-i", "lo", "-p", "tcp", "--dport", str(port), *comment, "-j", "DROP"],
        ["INPUT", "-i", "lo", "-p", "tcp", "--sport", str(port), *comment, "-j", "DROP"],
    ]


def _iptables(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([IPTABLES, "-w", *args], capture_output=True, text=True)


def drop_leftover_rules() -> int:
    """Delete every rule a SilentLink of a process no longer running left behind (a run killed while a link was
    silent); return how many. Rules of live processes, another test run's or a soak's, stay."""
    listing = _iptables("-S", "INPUT").stdout.splitlines()
    removed = 0
    for line in listing:
        owner = re.search(rf"{RULE_TAG}-\d+-pid(\d+)", line)
        if owner and line.startswith("-A ") and not Path(f"/proc/{owner.group(1)}").exists():
            # The tag has no spaces, so `-S` prints the rule unquoted and its words are the rule's arguments.
            _iptables("-D", *line.split()[1:]).check_returncode()
            removed += 1
    return removed


class SilentLink:
    """A loopback TCP forwarder to `upstream` whose packets can be dropped (`silence()`) and let through (`heal()`)."""

    def __init__(self, upstream: tuple[str, int], *, port: int | None = None):
        self.upstream = upstream
        self.port = port or free_port()
        self.silent = False
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()

    def __enter__(self) -> SilentLink:
        self.up()
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> None:
        """Start forwarding: connections to 127.0.0.1:port reach the upstream."""
        self._listener = listeners.listen(self.port, self._accept, backlog=128, name=f"silent-link-{self.port}")

    def down(self) -> None:
        """Let the packets through again, then stop forwarding and close every connection."""
        self.heal()
        listener, self._listener = self._listener, None
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        listeners.close(listener, sockets)

    def silence(self) -> None:
        """Drop every packet to and from the forwarder's port, both ways, telling no one."""
        if self.silent:
            return
        for rule in _rules(self.port):
            _iptables("-I", *rule).check_returncode()
        self.silent = True

    def heal(self) -> None:
        """Let the packets through again (no-op when not silent)."""
        if not self.silent:
            return
        for rule in _rules(self.port):
            # Deleted until none is left: a rule inserted twice by a crashed run must not keep the link silent.
            while _iptables("-D", *rule).returncode == 0:
                pass
        self.silent = False

    @contextlib.contextmanager
    def silenced(self) -> Iterator[None]:
        """Keep the link silent for the duration of the block."""
        self.silence()
        try:
            yield
        finally:
            self.heal()

    def through(self, url: str) -> str:
        """Return `url` (mysql://, amqp://, redis://) with its host and port replaced by the forwarder's."""
        parts = urlsplit(url)
        credentials, _, _ = parts.netloc.rpartition("@")
        netloc = f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=f"{credentials}@{netloc}" if credentials else netloc))

    def connections(self) -> int:
        """Return how many client connections the forwarder holds open now."""
        with self._lock:
            return len(self._sockets) // 2

    def _accept(self, listener: socket.socket) -> None:
        while True:
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
            for sock in (client, server):
                # The forwarder itself must not notice the silence early: only the processes under test may.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets |= {client, server}
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._sockets -= {src, dst}
            for sock in (src, dst):
                sock.close()


class SilentHost:
    """A machine cut off by its network: every packet to and from one loopback address dropped, telling no one.

    For a server that has an address of its own on the loopback (a Galera node of scripts/mariadb_cluster.sh, on
    127.0.3.N): it goes silent to its peers and its clients at once, connections it opened included, which a port
    cannot say. The rules carry the same tag as a SilentLink's, so drop_leftover_rules() lifts those of a dead run.
    """

    def __init__(self, address: str):
        self.address = address
        self.silent = False

    def _rules(self) -> list[list[str]]:
        tag = f"{RULE_TAG}-{int(ipaddress.ip_address(self.address))}-pid{os.getpid()}"
        comment = ["-m", "comment", "--comment", tag]
        return [
            ["INPUT", "-i", "lo", "-d", self.address, *comment, "-j", "DROP"],
            ["INPUT", "-i", "lo", "-s", self.address, *comment, "-j", "DROP"],
        ]

    def silence(self) -> None:
        """Drop every packet to and from the address."""
        if self.silent:
            return
        for rule in self._rules():
            _iptables("-I", *rule).check_returncode()
        self.silent = True

    def heal(self) -> None:
        """Let the packets through again (no-op when not silent)."""
        if not self.silent:
            return
        for rule in self._rules():
            while _iptables("-D", *rule).returncode == 0:
                pass
        self.silent = False
