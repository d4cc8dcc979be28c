"""What a test run leaves running, and what an earlier run left: found by a mark in their environment and stopped.

Each test process (the one pytest process, or each parallel worker) puts its own mark, its pid and start time, in
os.environ; every process a test starts inherits it, gunicorn's and Celery's children included, whatever session or
process group it runs in. So a process still running when its test process has ended is found by its mark alone: at
the end of a session, the test process stops what carries its own mark; at the start, what carries the mark of a test
process that is gone (a run killed by a timeout or a closed terminal). Such a process keeps serving and writing to
the test databases the next run recreates under the same names, and fails that run's tests on data they never wrote.

The shared services (MariaDB, RabbitMQ, Redis) are never stopped here: a test that started one again left it to the
machine, not to the run. The one mariadbd a run owns is a node of a Galera cluster it started
(scripts/mariadb_cluster.sh in a directory of testkit/galera_cluster.py, the node's config named by --defaults-file):
the script starts it with setsid, so it carries the mark of the test process that ran the script, as the cluster's
health checker and haproxy do. Left running, it keeps its addresses and ports, and the next run's cluster refuses to
start beside it. What was stopped is appended to `.run/leftovers.log`.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from testkit.processes import database_address, established, server_arguments

MARK = "CREDITSHOP_TEST_PROCESS"
# Daemons scripts/setup.sh starts for the whole machine; a test run owns none of them but its Galera nodes (below).
SHARED_SERVICES = frozenset({"mariadbd", "mysqld", "beam.smp", "epmd", "erl_child_setup", "redis-server"})
# Where testkit/galera_cluster.py puts a cluster's files: a node started there is a test run's, never the machine's.
CLUSTER_DIRECTORY_PREFIX = "creditshop-galera-"
CLUSTER_NODE = re.compile(rf"--defaults-file=\S*/{CLUSTER_DIRECTORY_PREFIX}[^/\s]*/gal\d+/my\.cnf(\s|$)")
LOG = Path(__file__).resolve().parents[1] / ".run" / "leftovers.log"


@dataclass(frozen=True)
class Process:
    pid: int
    mark: str
    command: str


def _stat(pid: int) -> list[str] | None:
    """Return the fields of /proc/PID/stat after the command name (field 3 on), None if the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after its closing one.
    return stat.rpartition(")")[2].split()


def _command(pid: int) -> str:
    """Return a process's command line ("" for a zombie); OSError if it is gone or not ours to read."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()


def mark_of(pid: int) -> str | None:
    """Return the mark of a live process: "PID:START" (its start time in clock ticks since boot, field 22 of
    /proc/PID/stat); None if it is gone."""
    fields = _stat(pid)
    return None if fields is None else f"{pid}:{fields[19]}"


def mark_this_process() -> str:
    """Put this process's mark in its environment, over one it inherited, and return it."""
    mark = mark_of(os.getpid())
    os.environ[MARK] = mark
    return mark


def owner_alive(mark: str) -> bool:
    """Return whether the test process that made `mark` still runs (a pid used again has another start time)."""
    pid, _, _ = mark.partition(":")
    return pid.isdigit() and mark_of(int(pid)) == mark


def marked_processes() -> list[Process]:
    """Return every running process that carries a mark, with it and its command line."""
    found = []
    prefix = f"{MARK}=".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            command = _command(int(entry.name))
            name = (entry / "comm").read_text().strip()
        except OSError:  # gone, or not ours to read
            continue
        mark = next((item[len(prefix) :].decode() for item in environ if item.startswith(prefix)), None)
        if mark is None or not command:  # not ours, or a zombie
            continue
        if name in SHARED_SERVICES and not CLUSTER_NODE.search(command):
            continue
        found.append(Process(int(entry.name), mark, command))
    return found


def stop(processes: list[Process], *, reason: str, grace: float = 10) -> list[Process]:
    """SIGTERM each process, SIGKILL what is left after `grace` seconds; log them; return them."""
    if not processes:
        return []
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    alive = list(processes)
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [process for process in alive if _running(process.pid)]
    for process in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
    LOG.parent.mkdir(parents=True, exist_ok=True)
    with LOG.open("a") as log:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        for process in processes:
            killed = " (SIGKILL)" if process in alive else ""
            log.write(f"{stamp} {reason}: pid {process.pid}{killed} [{process.mark}] {process.command[:300]}\n")
    return processes


def _running(pid: int) -> bool:
    """Return whether a process runs (a zombie waiting for its parent does not)."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def stop_orphans() -> list[Process]:
    """Stop every marked process whose test process is gone: what an earlier, interrupted run left running."""
    orphans = [process for process in marked_processes() if not owner_alive(process.mark)]
    return stop(orphans, reason="left by a test process that is gone")


def stop_own(mark: str, group: int) -> list[Process]:
    """Stop every process carrying `mark` (a test process's, at the end of its session) outside its process `group`.

    One started in a session or group of its own (the services a test starts) outlives the test process unless the
    test stops it; one in the test process's own group (the SparkSession's JVM, which exits when its stdin closes)
    ends with it.
    """
    own = [process for process in marked_processes() if process.mark == mark and _group(process.pid) != group]
    return stop(own, reason="still running when its test session ended")


def _group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def describe(processes: list[Process]) -> str:
    return "\n".join(f"  pid {process.pid}: {process.command[:200]}" for process in processes)


def connection_owners(port: int) -> dict[int, str]:
    """Return, per local TCP port connected to `port`, the pid and command of the process holding it."""
    owners = {}
    for line in established(f"( dport = :{port} )").splitlines():
        local = re.search(r":(\d+)\s+\S+:\d+", line)
        pid = re.search(r"pid=(\d+)", line)
        if local and pid:
            try:
                command = _command(int(pid[1]))
            except OSError:
                command = "?"
            owners[int(local[1])] = f"pid {pid[1]}: {command[:200]}"
    return owners


def foreign_connections(alias: str, names: list[str]) -> list[str]:
    """Return the connections another process holds to any of the databases `names` on the server behind `alias`,
    each described with the process behind it where it is local."""
    import MySQLdb

    server = MySQLdb.connect(**server_arguments(alias), connect_timeout=10)
    try:
        with server.cursor() as cursor:
            cursor.execute(
                "SELECT ID, HOST, DB, COMMAND, TIME FROM information_schema.PROCESSLIST"
                " WHERE DB IN %s AND ID <> CONNECTION_ID()",
                (tuple(names),),
            )
            rows = cursor.fetchall()
    finally:
        server.close()
    if not rows:
        return []
    owners = connection_owners(database_address(alias)[1])
    described = []
    for connection_id, client, database, command, seconds in rows:
        client_port = client.rpartition(":")[2]
        owner = (owners.get(int(client_port)) if client_port.isdigit() else None) or "process unknown"
        described.append(f"connection {connection_id} from {client} to {database} ({command}, {seconds} s): {owner}")
    return described
