"""What a benchmarked run cost, from /proc: CPU seconds and peak memory per process, and the database server's share.

On a shared machine the wall time mostly measures the other jobs; CPU seconds per process are steadier. Processes
are sampled (own user + system time, and VmHWM, the peak resident set the kernel keeps), so a process loses at
most its last sampling interval; the database server's CPU is counted only on the threads serving our schemas
(information_schema.PROCESSLIST names each connection's OS thread as TID), beside the whole server's.
"""

import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import MySQLdb

from bench.common import listener_pid

CLOCK_TICKS = 100  # USER_HZ on Linux; os.sysconf("SC_CLK_TCK") says the same on every kernel this runs on
SAMPLE_SECONDS = 0.25
# Short enough to see most of a JDBC partition's connection (each task opens its own), cheap: one PROCESSLIST query.
SERVER_SAMPLE_SECONDS = 0.1
SERVER_NAMES = ("mariadbd", "mysqld")


def _stat_fields(path: Path) -> list[str] | None:
    """Return the fields of a /proc stat file after the command name (state, ppid, ...), or None if it is gone."""
    try:
        return path.read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def stat_name_and_fields(path: Path) -> tuple[str, list[str]] | None:
    """Return the command name of a /proc stat file and the fields after it, or None if it is gone."""
    try:
        name, rest = path.read_text().split("(", 1)[1].rsplit(")", 1)
    except (OSError, IndexError, ValueError):
        return None
    return name, rest.split()


def cpu_seconds(stat: list[str]) -> float:
    """Return a process's (or thread's) own user + system time from its stat fields (proc(5) fields 14 and 15)."""
    return (int(stat[11]) + int(stat[12])) / CLOCK_TICKS


def peak_rss_bytes(pid: int) -> int | None:
    """Return the peak resident set (VmHWM) of a live process, or None if it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    match = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else None


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def server_pid(connection: MySQLdb.Connection) -> int | None:
    """Return the pid of the MariaDB/MySQL server behind `connection`, or None when it is not a process of this machine.

    The server is found by the port it says it serves, not by name: tests start other mariadbd processes on free
    ports, and the first one in /proc need not be the one we talk to.
    """
    cursor = connection.cursor()
    cursor.execute("SELECT @@port")
    (port,) = cursor.fetchone()
    pid = listener_pid(int(port))
    try:
        return pid if pid is not None and Path(f"/proc/{pid}/comm").read_text().strip() in SERVER_NAMES else None
    except OSError:
        return None


def process_cpu_seconds(pid: int | None) -> float | None:
    """Return a process's CPU time so far, all threads, or None when there is no such process."""
    stat = _stat_fields(Path(f"/proc/{pid}/stat")) if pid else None
    return cpu_seconds(stat) if stat else None


@dataclass
class ProcessSeen:
    pid: int
    command: str
    # The kernel's command name; when it changes, the process exec'd (spark-class, a shell script, becomes java).
    name: str = ""
    cpu_seconds: float = 0.0
    peak_rss_bytes: int = 0


@dataclass
class TreeSampler:
    """Sample every process under some root processes until stopped: each one's CPU time and peak memory.

    `roots` is called at each sample, so a cluster's daemons can be added before they start.
    """

    roots: Callable[[], Iterable[int]]
    seen: dict[int, ProcessSeen] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> "TreeSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            self.sample()

    def sample(self) -> None:
        roots = set(self.roots())
        parents: dict[int, int] = {}
        stats: dict[int, tuple[str, list[str]]] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and (found := stat_name_and_fields(entry / "stat")) is not None:
                parents[int(entry.name)] = int(found[1][1])
                stats[int(entry.name)] = found
        for pid, (name, stat) in stats.items():
            ancestor = pid
            while ancestor > 1 and ancestor not in roots:
                ancestor = parents.get(ancestor, 0)
            if ancestor not in roots:
                continue
            seen = self.seen.get(pid)
            if seen is None:
                seen = self.seen[pid] = ProcessSeen(pid, command_line(pid), name)
            elif seen.name != name:
                seen.command, seen.name = command_line(pid), name
            seen.cpu_seconds = max(seen.cpu_seconds, cpu_seconds(stat))
            seen.peak_rss_bytes = max(seen.peak_rss_bytes, peak_rss_bytes(pid) or 0)

    def matching(self, pattern: str) -> list[ProcessSeen]:
        """The processes seen whose command line contains `pattern`."""
        return [seen for seen in self.seen.values() if pattern in seen.command]

    def total_cpu_seconds(self) -> float:
        return sum(seen.cpu_seconds for seen in self.seen.values())


class ServerThreads:
    """Count the database server's CPU spent on the connections to some schemas, polled until stopped.

    A thread seen serving one of the schemas counts from the start (every server thread's time is read then; a
    thread started later counts from zero) to when it was last seen, a last poll following the stop: a connection
    opened and closed between two polls is missed, and a pooled thread's work for another client in the same window
    would be counted. None when the server is not a process of this machine.
    """

    def __init__(self, connect: Callable[[], MySQLdb.Connection], schemas: Iterable[str]) -> None:
        self._connect = connect
        self._schemas = tuple(schemas)
        probe = connect()
        try:
            self._pid = server_pid(probe)
        finally:
            probe.close()
        self._threads: dict[int, list[float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._whole_start = process_cpu_seconds(self._pid)
        self._start = self._thread_times() if self._pid is not None else {}
        self.cpu_seconds: float | None = None
        self.whole_server_cpu_seconds: float | None = None

    def _thread_times(self) -> dict[int, float]:
        times = {}
        for task in Path(f"/proc/{self._pid}/task").iterdir():
            if (stat := _stat_fields(task / "stat")) is not None:
                times[int(task.name)] = cpu_seconds(stat)
        return times

    def __enter__(self) -> "ServerThreads":
        if self._pid is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._pid is None:
            return
        self._stop.set()
        self._thread.join()
        self.cpu_seconds = round(sum(last - first for first, last in self._threads.values()), 2)
        whole_end = process_cpu_seconds(self._pid)
        if whole_end is not None and self._whole_start is not None:
            self.whole_server_cpu_seconds = round(whole_end - self._whole_start, 2)

    def _loop(self) -> None:
        connection = self._connect()
        try:
            cursor = connection.cursor()
            placeholders = ", ".join(["%s"] * len(self._schemas))
            query = f"SELECT TID FROM information_schema.PROCESSLIST WHERE DB IN ({placeholders})"  # noqa: S608
            while True:
                # One more poll after the stop, so work finished since the last poll still counts.
                stopping = self._stop.is_set()
                cursor.execute(query, self._schemas)
                for (tid,) in cursor.fetchall():
                    stat = _stat_fields(Path(f"/proc/{self._pid}/task/{tid}/stat"))
                    if stat is not None:
                        seconds = cpu_seconds(stat)
                        self._threads.setdefault(tid, [self._start.get(tid, 0.0), seconds])[1] = seconds
                if stopping:
                    break
                self._stop.wait(SERVER_SAMPLE_SECONDS)
        finally:
            connection.close()


# The pauses of -Xlog:gc that collect: G1's, serial's and parallel's young and full collections.
COLLECTING_PAUSES = ("Young", "Full")


def gc_log_peaks(paths: Iterable[Path]) -> dict[str, int]:
    """Return the largest heap in use before a collection, the largest left after one, and the largest heap committed,
    over JVM GC logs (-Xlog:gc).

    Before a collection the heap holds whatever garbage fits (a collector lets it fill), so that peak follows the heap
    allowed more than the work; what a collection leaves is the live data plus garbage not yet reclaimed (a young
    collection leaves the old generation's), an upper bound of what the run needs. Only young and full collections
    count as collections: G1's Remark and Cleanup pauses of a concurrent cycle move nothing, and their lines give the
    heap in use at that moment, garbage included.
    Lines look like ``GC(3) Pause Young (Normal) (G1 Evacuation Pause) 120M->30M(256M) 3.1ms``.
    """
    units = {"K": 1024, "M": 1024**2, "G": 1024**3}
    used = after = committed = 0
    for path in paths:
        for pause, before, b_unit, left, l_unit, size, s_unit in re.findall(
            r"Pause (\w+).*?(\d+)([KMG])->(\d+)([KMG])\((\d+)([KMG])\)", path.read_text(errors="replace")
        ):
            used = max(used, int(before) * units[b_unit])
            if pause in COLLECTING_PAUSES:
                after = max(after, int(left) * units[l_unit])
            committed = max(committed, int(size) * units[s_unit])
    return {"heap_used_peak_bytes": used, "heap_after_gc_peak_bytes": after, "heap_committed_peak_bytes": committed}
