"""Restarting each process type the way an operator does, while orders flow, and timing how long each takes to stop.

Shared by the restart tests (tests/reliability/test_restarts.py) and the soak's rolling-restart phase
(bench/soak.py). A stop is the signal docs/OPERATIONS.md gives for the process, sent to its main process only
(systemd's KillMode=mixed); the process is started again once it has exited.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from tests.reliability.harness import Backends, Cluster, Ledger, Stopped

# What each process logs once it is ready again.
READY_LINES = {
    "relay": "relaying; SIGTERM",
    "outbox": " ready.",
    "credits": " ready.",
    "analytics": " ready.",
    "beat": "beat: Starting...",
}
# How long after a process is back its restart still counts towards the latency window: requests started during the
# restart finish within it.
SETTLE_SECONDS = 2.0


@dataclass(frozen=True)
class Restart:
    """One restart: how it was done, how the process stopped, and when (monotonic) it began and was ready again."""

    how: str
    stopped: Stopped
    began: float
    ready: float

    def latency_p99(self, ledger: Ledger) -> tuple[float, int]:
        """Return the p99 of the orders acknowledged from the signal until shortly after the process was back."""
        return ledger.latency_p99(since=self.began, until=self.ready + SETTLE_SECONDS)

    def summary(self, ledger: Ledger) -> str:
        p99, count = self.latency_p99(ledger)
        return (
            f"{self.how}: stopped in {self.stopped.seconds:.2f} s (exit {self.stopped.returncode},"
            f" {self.stopped.leftovers} left behind), ready again after {self.ready - self.began:.1f} s;"
            f" order p99 {p99 * 1000:.1f} ms over {count} orders"
        )


def wait_for(predicate, *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


def log_count(cluster: Cluster, name: str, text: str) -> int:
    path = cluster.workdir / "logs" / f"{name}.log"
    return path.read_text(errors="replace").count(text) if path.exists() else 0


def restart(
    cluster: Cluster, name: str, *, timeout: float = 120, while_stopped: Callable[[], object] = lambda: None
) -> Restart:
    """SIGTERM a process, wait for it to exit, call `while_stopped`, start it again and wait until it is ready."""
    line = READY_LINES.get(name)
    readies = log_count(cluster, name, line) if line else 0
    began = time.monotonic()
    stopped = cluster.terminate(name, timeout=timeout)
    while_stopped()
    cluster.start(name)
    if line:
        wait_for(lambda: log_count(cluster, name, line) > readies, timeout=timeout, what=f"{name} to be ready again")
    return Restart(how=f"{name}: SIGTERM, start", stopped=stopped, began=began, ready=time.monotonic())


def reload_gunicorn(cluster: Cluster, name: str = "web", *, timeout: float = 60) -> Restart:
    """Send gunicorn's master HUP and wait until every old worker has exited and as many new ones serve.

    The stop time is the old workers': from the HUP until the last of them exited.
    """
    old = cluster.children(name)
    began = time.monotonic()
    os.kill(cluster.procs[name].pid, signal.SIGHUP)

    def replaced() -> bool:
        current = cluster.children(name)
        return not (current & old) and len(current) == cluster.web_workers

    wait_for(replaced, timeout=timeout, what=f"gunicorn {name} to replace its workers")
    replaced_at = time.monotonic()
    assert cluster.procs[name].poll() is None, f"gunicorn's master exited on HUP:\n{cluster.logs(name)}"
    # The master keeps running: no exit code; the stop time is its old workers'.
    stopped = Stopped(name, seconds=replaced_at - began, returncode=None, leftovers=0)
    cluster.wait_healthy(cluster.web_urls[name])
    return Restart(how=f"{name}: HUP (graceful reload)", stopped=stopped, began=began, ready=time.monotonic())


def restart_behind_other(cluster: Cluster, backends: Backends, name: str, *, timeout: float = 60) -> Restart:
    """Take one gunicorn out of the clients' rotation, SIGTERM it, start it, and put it back once healthy."""
    url = cluster.web_urls[name]
    began = time.monotonic()
    backends.drain(url)
    stopped = cluster.terminate(name, timeout=timeout)
    cluster.start(name)
    backends.undrain(url)
    return Restart(
        how=f"{name}: drained, SIGTERM, start, back in rotation", stopped=stopped, began=began, ready=time.monotonic()
    )


def assert_clean_restart(restarts: list[Restart], ledger: Ledger, *, p99_limit: float) -> None:
    """Fail unless every process exited 0 on its own, left nothing behind, and orders stayed fast and answered."""
    for item in restarts:
        assert item.stopped.returncode in (0, None), item
        assert item.stopped.seconds < math.inf, item
        assert item.stopped.leftovers == 0, item
        p99, count = item.latency_p99(ledger)
        assert count > 0, f"no order was acknowledged during {item.how}: the restart was not under load"
        assert p99 <= p99_limit, f"{item.how}: order p99 {p99 * 1000:.1f} ms"
    failures = {status: n for status, n in ledger.statuses.items() if status != 201}
    assert failures == {}, f"answers other than 201 during the restarts: {failures}"
