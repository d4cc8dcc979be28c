"""Shared plumbing for the benchmarks: a dedicated database, Django setup, and starting/stopping gunicorn."""

import os
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The benchmarks stop their processes with the tests' helper (testkit/processes.py).
sys.path.insert(0, str(ROOT))
from testkit.processes import stop_processes  # noqa: E402

# The virtualenv running the bench, whose gunicorn and celery it starts (a git worktree may share another's venv).
VENV_BIN = Path(sys.executable).parent
BENCH_DATABASE_URL = os.environ.get("BENCH_DATABASE_URL", "mysql://root:@127.0.0.1:3306/creditshop_bench")
# The credits service's own database, as in production a separate one (its URL may name another server).
BENCH_CREDITS_DATABASE_URL = os.environ.get(
    "BENCH_CREDITS_DATABASE_URL", "mysql://root:@127.0.0.1:3306/creditshop_bench_credits"
)


def ratio(numerator: float, denominator: float) -> str:
    """`numerator / denominator` as `0.87x`, or `n/a` where the denominator is zero: a process whose CPU did not reach
    one clock tick in a short run (the smoke test's one round of a few seconds)."""
    return f"{numerator / denominator:.2f}x" if denominator else "n/a (none measured)"


def bench_env(**extra: str) -> dict:
    """Return the environment for benchmark processes: the bench databases, production-like settings."""
    env = dict(os.environ)
    env.update(
        DATABASE_URL=BENCH_DATABASE_URL,
        CREDITS_DATABASE_URL=BENCH_CREDITS_DATABASE_URL,
        DJANGO_SETTINGS_MODULE="config.settings",
        DJANGO_DEBUG="false",
        DJANGO_SECURE_SSL_REDIRECT="false",
        DJANGO_SECRET_KEY="bench-only-secret-key-0123456789-abcdefghijklmnopqrstuvwxyz",
        ORDERS_RATE_LIMIT="none",
        LOG_LEVEL="WARNING",
    )
    env.update(extra)
    return env


def setup_django(**env: str) -> None:
    """Point this process at the bench databases, create them, migrate each under its alias and set Django up.

    `env` overrides bench_env's variables (another DJANGO_SETTINGS_MODULE, say).
    """
    os.environ.update(bench_env(**env))
    import MySQLdb

    for url in (BENCH_DATABASE_URL, BENCH_CREDITS_DATABASE_URL):
        name = url.rsplit("/", 1)[1]
        conn = MySQLdb.connect(host="127.0.0.1", user="root", password="")
        conn.cursor().execute(
            f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
        )
        conn.close()
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    call_command("migrate", database="credits", verbosity=0)


def start_gunicorn(port: int, *, workers: int, threads: int, code_dir: Path = ROOT, **env: str) -> subprocess.Popen:
    """Start `gunicorn config.wsgi` with keep-alive threads and wait until /healthz answers; `env` overrides.

    `code_dir` runs another checkout of the service (e.g. main's, for a before/after comparison) with this venv.
    """
    proc = subprocess.Popen(
        [
            str(VENV_BIN / "gunicorn"),
            "config.wsgi",
            f"--bind=127.0.0.1:{port}",
            f"--workers={workers}",
            f"--threads={threads}",
            "--keep-alive=30",
            "--log-level=warning",
        ],
        cwd=code_dir,
        env=bench_env(**env),
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)  # noqa: S310 (loopback only)
            return proc
        except OSError:
            time.sleep(0.2)
    stop_processes(proc, grace=15)
    raise RuntimeError("gunicorn did not become healthy within 30 s")


def outbox_backlog_discard(reason: str) -> int:
    """Discard every pending transaction_log row in the bench database; return how many there were.

    Order benchmarks leave their rows pending (no relay runs during them); a later end-to-end run would otherwise
    start behind that backlog and measure its drain instead of the latency of its own orders.
    """
    from outbox.models import TransactionLog

    return TransactionLog.objects.filter(status=TransactionLog.Status.PENDING).update(
        status=TransactionLog.Status.DISCARDED, discarded_reason=reason, discarded_by="bench"
    )


class OtlpSink:
    """An OTLP/HTTP endpoint that accepts and drops every export, counting requests and bytes: tracing really exports.

    Runs in the benchmark's own process, so its CPU is not charged to the service being measured.
    """

    def __init__(self):
        self.requests = self.bytes = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                sink.requests += 1
                sink.bytes += length
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def env(self) -> dict[str, str]:
        """Return the standard OTEL_* variables that turn tracing on, every trace sampled, exported here."""
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{self.server.server_address[1]}",
            "OTEL_TRACES_SAMPLER": "always_on",
        }

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def process_tree_cpu_seconds(pid: int) -> float:
    """Return the user + system CPU seconds of a process and all its live descendants."""
    total = 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return total
    return total + sum(process_tree_cpu_seconds(int(child)) for child in children)


def listener_pid(port: int) -> int | None:
    """Return the pid of the process listening on TCP `port` (IPv4 or IPv6), or None when nothing does.

    The shared MariaDB, RabbitMQ and Redis are found by the port they serve, not by name: tests start other
    mariadbd and beam.smp processes on free ports, and those are not the ones a benchmark talks to.
    """
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    return int(proc.name)
        except OSError:
            continue
    return None


class HostCpu:
    """CPU seconds of named process trees read from /proc, so a benchmark can charge each one its share per operation.

    Register each process involved (the service's own children by their Popen pid, shared servers by the port they
    listen on); `snapshot()` reads them all, `per_operation()` turns two snapshots into CPU milliseconds per operation.
    """

    def __init__(self):
        self.pids: dict[str, tuple[int, ...]] = {}

    def add(self, name: str, *pids: int | None) -> None:
        """Charge `name` with these processes' trees from now on (in place of what it was charged with before)."""
        if not pids or None in pids:
            raise RuntimeError(f"{name}: no such process to measure")
        self.pids[name] = pids

    def add_listener(self, name: str, port: int) -> None:
        self.add(name, listener_pid(port))

    def snapshot(self) -> dict[str, float]:
        return {name: sum(process_tree_cpu_seconds(pid) for pid in pids) for name, pids in self.pids.items()}

    @staticmethod
    def per_operation(before: dict[str, float], after: dict[str, float], operations: int) -> dict[str, float]:
        """Return CPU ms per operation for each process between two snapshots, plus their sum under "host"."""
        costs = {name: (after[name] - before[name]) * 1000 / max(operations, 1) for name in after}
        costs["host"] = sum(costs.values())
        return costs


def host_busy_seconds() -> float:
    """Return the CPU seconds every core of this host has spent busy since boot (all processes, /proc/stat)."""
    user, nice, system, idle, iowait, irq, softirq, steal = map(int, Path("/proc/stat").read_text().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
