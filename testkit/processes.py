"""What a child process started by a test needs to reach this test run's databases and broker; a free port for it,
the connections it holds, and stopping it; the cluster scripts' commands.

The one place test code builds a database or broker URL: from the live connection settings of an alias (under
pytest, its test database), so a test that moves an alias (another server, another user) moves its children too.
"""

import collections
import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from django.conf import settings
from django.db import connections

from testkit.workers import worker_count, worker_id

# The environment variable that gives each database alias to a process (docs/CONTRACT.md, "Settings").
DATABASE_URL_VARIABLES = {"default": "DATABASE_URL", "credits": "CREDITS_DATABASE_URL"}


def mysql_url(*, host: str, port: int, name: str, user: str = "root", password: str = "") -> str:
    """Return a DATABASE_URL-style URL, the user and password percent-encoded as core.env expects."""
    return f"mysql://{quote(user, safe='')}:{quote(password, safe='')}@{host}:{port}/{name}"


def database_address(alias: str = "default") -> tuple[str, int]:
    """Return the (host, port) of the server behind an alias, with the defaults the settings leave empty."""
    db = connections[alias].settings_dict
    return db["HOST"] or "127.0.0.1", int(db["PORT"] or 3306)


@contextlib.contextmanager
def connections_through(port: int, *aliases: str):
    """Point the aliases' connections at a forwarder on this loopback port (a proxy, a SilentLink) for a while, then
    back at their server. The settings are the process's: connections other threads open meanwhile go through too."""
    saved = {alias: {key: connections[alias].settings_dict[key] for key in ("HOST", "PORT")} for alias in aliases}
    for alias in aliases:
        connections[alias].close()
        connections[alias].settings_dict.update(HOST="127.0.0.1", PORT=str(port))
    try:
        yield
    finally:
        for alias, address in saved.items():
            connections[alias].close()
            connections[alias].settings_dict.update(address)


def database_url(
    alias: str = "default",
    *,
    user: str | None = None,
    password: str | None = None,
    port: int | None = None,
    name: str | None = None,
) -> str:
    """Return the URL of the database behind an alias (its test database under pytest).

    Optionally as another user, through another port on 127.0.0.1 (a proxy in front of the server), or naming
    another database on the same server.
    """
    db = connections[alias].settings_dict
    host, own_port = database_address(alias)
    return mysql_url(
        host="127.0.0.1" if port is not None else host,
        port=own_port if port is None else port,
        name=db["NAME"] if name is None else name,
        user=db["USER"] if user is None else user,
        password=db["PASSWORD"] if password is None else password,
    )


def broker_url(*, port: int | None = None) -> str:
    """Return this test run's broker URL (its own vhost), optionally through another port on 127.0.0.1."""
    url = settings.CELERY_BROKER_URL
    if port is None:
        return url
    parts = urlsplit(url)
    credentials = parts.netloc.rpartition("@")[0]
    netloc = f"{credentials}@127.0.0.1:{port}" if credentials else f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


def service_env(**extra: str) -> dict[str, str]:
    """Return os.environ plus both database URLs and the broker URL of this test run, then `extra`."""
    env = dict(os.environ)
    env.update({variable: database_url(alias) for alias, variable in DATABASE_URL_VARIABLES.items()})
    env.update(
        CELERY_BROKER_URL=broker_url(),
        DJANGO_SETTINGS_MODULE="config.settings",
        PYTHONPATH=str(settings.BASE_DIR),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


# Where free_port picks: below the kernel's ephemeral range (net.ipv4.ip_local_port_range, 32768-60999 by default),
# from which every outgoing connection and every bind to port 0 take a port, so none can take a picked port in the
# seconds before the process it is for binds it; above the ports tests fix (the Spark cluster's 18600s, the harness'
# default 18900) and below RabbitMQ's distribution port (25672) and the cluster scripts' (25700s).
PORT_RANGE = range(19000, 25600)


class PortPicker:
    """Hands out ports from this worker's share of PORT_RANGE in turn, from a random start, each checked free.

    Each pytest-xdist worker walks a share of its own, so two workers never pick one port; a process walking from a
    random start (a pytest run started by a test, a benchmark) rarely meets another's walk, and a port it meets bound
    is passed over."""

    def __init__(self, ports: range = PORT_RANGE):
        self.ports = ports
        self.lock = threading.Lock()
        self.next: int | None = None

    def share(self) -> range:
        """This worker's part of the range (all of it outside a parallel run)."""
        worker, count = worker_id(), worker_count()
        if worker is None or not worker.removeprefix("gw").isdigit():
            return self.ports
        size = len(self.ports) // count
        index = int(worker.removeprefix("gw")) % count
        return self.ports[index * size : (index + 1) * size]

    def take(self, count: int = 1) -> int:
        """Return the first of `count` consecutive ports nothing is bound to on 127.0.0.1 right now, none handed out
        before by this process since its walk last went round."""
        share = self.share()
        with self.lock:
            if self.next not in share:
                self.next = random.randrange(share.start, share.stop)  # noqa: S311 (not a secret)
            for _ in range(len(share)):
                first = self.next if self.next + count <= share.stop else share.start
                self.next = first + count if first + count < share.stop else share.start
                if all(bindable(port) for port in range(first, first + count)):
                    return first
        raise RuntimeError(f"no {count} consecutive free ports in {share.start}-{share.stop - 1}")


def bindable(port: int) -> bool:
    """Whether a TCP socket can bind 127.0.0.1:port right now."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


PORTS = PortPicker()


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now and no other worker of this run will pick
    (PortPicker)."""
    return PORTS.take()


def free_ports(count: int) -> int:
    """Return the first of `count` consecutive such ports, for a cluster whose script numbers its nodes' ports from
    a base."""
    return PORTS.take(count)


def server_arguments(alias: str = "default") -> dict:
    """Return MySQLdb.connect's arguments for the server behind an alias, as its user, no database named."""
    db = connections[alias].settings_dict
    host, port = database_address(alias)
    return {"host": host, "port": port, "user": db["USER"], "password": db["PASSWORD"]}


def _sockets(*arguments: str) -> str:
    """Return iproute2's `ss -tnpH ARGUMENTS` lines: TCP sockets, numeric, each with its processes, no header."""
    return subprocess.run(["ss", "-tnpH", *arguments], capture_output=True, text=True, check=True, timeout=30).stdout


def established(selector: str) -> str:
    """Return the `ss` lines of the established TCP connections `selector` picks, with the process holding each side
    on this machine ("( sport = :PORT )", "( dport = :PORT )")."""
    return _sockets("state", "established", selector)


def listening(port: int) -> set[int]:
    """Return the pids of the processes holding a socket that listens on TCP `port` (any address of this machine):
    a server that shares its port through SO_REUSEPORT, as haproxy does, takes a share of the connections silently."""
    return {int(pid) for pid in re.findall(r"pid=(\d+)", _sockets("state", "listening", f"( sport = :{port} )"))}


def connections_per_worker(port: int) -> list[int]:
    """Return how many established connections to `port` each process holds, most first.

    For gunicorn: a worker keeps each keep-alive connection it accepted, so this is how a client's connections were
    spread over the workers (gunicorn.conf.py, tests/test_gunicorn_conf.py, bench/bench_orders.py).
    """
    listing = established(f"( sport = :{port} )")
    return sorted(collections.Counter(re.findall(r"pid=(\d+)", listing)).values(), reverse=True)


def stop_processes(
    *processes: subprocess.Popen, sig: int = signal.SIGTERM, grace: float = 20, group: bool = False
) -> list[int | None]:
    """Stop processes: send each `sig`, give them `grace` seconds together, then SIGKILL those still running.

    With `group`, the signals go to each process's group (one started with start_new_session), and what is left of
    a group once its leader exited is killed. Return each one's exit code, None for one that had to be killed.
    """

    def send(process: subprocess.Popen, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(process.pid, signum)
            else:
                process.send_signal(signum)

    for process in processes:
        if process.poll() is None:
            send(process, sig)
    deadline = time.monotonic() + grace
    codes: list[int | None] = []
    for process in processes:
        try:
            codes.append(process.wait(timeout=max(deadline - time.monotonic(), 0)))
        except subprocess.TimeoutExpired:
            send(process, signal.SIGKILL)
            process.wait(timeout=30)
            codes.append(None)
        if group:
            send(process, signal.SIGKILL)
    return codes


def cluster_script(
    script: Path,
    command: str,
    directory: Path,
    *args: str,
    timeout: float = 300,
    check: bool = True,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run a command of scripts/mariadb_cluster.sh or scripts/rabbitmq_cluster.sh on the cluster in `directory`,
    with `env`'s variables over this process's environment.

    With `check`, a command that fails raises with what it printed; without, its exit status is the answer (`pid`).
    """
    result = subprocess.run(
        [str(script), command, str(directory), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    if check and result.returncode != 0:
        raise RuntimeError(f"{script.name} {' '.join((command, *args))} failed:\n{result.stdout}\n{result.stderr}")
    return result
