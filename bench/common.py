"""Shared plumbing for the benchmarks: a dedicated database, Django setup, and starting/stopping gunicorn."""

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_DATABASE_URL = os.environ.get("BENCH_DATABASE_URL", "mysql://root:@127.0.0.1:3306/creditshop_bench")


def bench_env(**extra: str) -> dict:
    """Return the environment for benchmark processes: the bench database, production-like settings."""
    env = dict(os.environ)
    env.update(
        DATABASE_URL=BENCH_DATABASE_URL,
        DJANGO_SETTINGS_MODULE="config.settings",
        DJANGO_DEBUG="false",
        DJANGO_SECURE_SSL_REDIRECT="false",
        DJANGO_SECRET_KEY="bench-only-secret-key-0123456789-abcdefghijklmnopqrstuvwxyz",
        ORDERS_RATE_LIMIT="none",
        LOG_LEVEL="WARNING",
    )
    env.update(extra)
    return env


def setup_django() -> None:
    """Point this process at the bench database, create it, migrate it and set Django up."""
    os.environ.update(bench_env())
    sys.path.insert(0, str(ROOT))
    import MySQLdb

    name = BENCH_DATABASE_URL.rsplit("/", 1)[1]
    conn = MySQLdb.connect(host="127.0.0.1", user="root", password="")
    conn.cursor().execute(f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci")
    conn.close()
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def start_gunicorn(port: int, *, workers: int, threads: int, **env: str) -> subprocess.Popen:
    """Start `gunicorn config.wsgi` with keep-alive threads and wait until /healthz answers; `env` overrides."""
    proc = subprocess.Popen(
        [
            str(ROOT / ".venv/bin/gunicorn"),
            "config.wsgi",
            f"--bind=127.0.0.1:{port}",
            f"--workers={workers}",
            f"--threads={threads}",
            "--worker-class=gthread",
            "--keep-alive=30",
            "--log-level=warning",
        ],
        cwd=ROOT,
        env=bench_env(**env),
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)  # noqa: S310 (loopback only)
            return proc
        except OSError:
            time.sleep(0.2)
    stop(proc)
    raise RuntimeError("gunicorn did not become healthy within 30 s")


def stop(proc: subprocess.Popen) -> None:
    """Stop a child process with SIGTERM, then SIGKILL if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def percentile(sorted_values: list[float], p: float) -> float:
    """Return the p-th percentile (0..100) of already sorted values, nearest-rank."""
    if not sorted_values:
        return float("nan")
    index = max(0, min(len(sorted_values) - 1, round(p / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[index]


def outbox_backlog_discard(reason: str) -> int:
    """Discard every pending transaction_log row in the bench database; return how many there were.

    Order benchmarks leave their rows pending (no relay runs during them); a later end-to-end run would otherwise
    start behind that backlog and measure its drain instead of the latency of its own orders.
    """
    from outbox.models import TransactionLog

    return TransactionLog.objects.filter(status=TransactionLog.Status.PENDING).update(
        status=TransactionLog.Status.DISCARDED, discarded_reason=reason, discarded_by="bench"
    )
