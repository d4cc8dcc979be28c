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

from testkit import waiting
from testkit.harness import Cluster, Stopped
from testkit.load import LATENCY_NOISE_FACTOR, Backends, Ledger
from testkit.waiting import wait_for

# What each process logs once it is ready again.
READY_LINES = {
    "relay": "relaying; SIGTERM",
    "outbox": " ready.",
    "credits": " ready.",
    "analytics": " ready.",
    "beat": "beat: Starting...",
}
# What a gunicorn worker logs once it takes requests (gunicorn.conf.py).
WEB_WORKER_READY = "Worker ready (pid: "
# How long after a process is back its restart still counts towards the latency window: requests started during the
# restart finish within it.
SETTLE_SECONDS = 2.0
# The first orders of a stream load the API in each web worker: not the steady latency a restart is compared with.
WARM_UP_SECONDS = 1.0
# The order p99 a restart may reach (the restart tests and the soak's rolling restart; gunicorn's HUP is not held to
# it). A functional bound (orders take ~15 ms idle; PERFORMANCE.md): a restart that stalled orders crosses it; one
# that refused them fails on its answers (connection errors, non-201s) whatever their latency. Not tighter: a prefork
# worker starting on the same two cores (Django, Celery and a pool process imported, about 2 CPU-seconds) takes the
# order p99 near 400 ms on a slow 2-core machine (docs/RELIABILITY.md).
RESTART_P99_LIMIT_SECONDS = 0.500


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

    def failed_answers(self, ledger: Ledger) -> list[tuple[float, int | str]]:
        """Return the 5xx answers and connection errors (refused or other) clients got during this restart."""
        until = self.ready + SETTLE_SECONDS
        with ledger.lock:
            return [
                (at, what) for at, what in ledger.server_errors + ledger.connection_errors if self.began <= at <= until
            ]

    def summary(self, ledger: Ledger) -> str:
        p99, count = self.latency_p99(ledger)
        return (
            f"{self.how}: stopped in {self.stopped.seconds:.2f} s (exit {self.stopped.returncode},"
            f" {self.stopped.leftovers} left behind), ready again after {self.ready - self.began:.1f} s;"
            f" order p99 {p99 * 1000:.1f} ms over {count} orders; {len(self.failed_answers(ledger))} 5xx or"
            " connection errors"
        )


def log_count(cluster: Cluster, name: str, text: str) -> int:
    return waiting.log_count(cluster.workdir / "logs" / f"{name}.log", text)


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
    """Send gunicorn's master HUP and wait until every old worker has exited and each new one is ready.

    The stop time is the old workers': from the HUP until the last of them exited.
    """
    old = cluster.children(name)
    readies = log_count(cluster, name, WEB_WORKER_READY)
    began = time.monotonic()
    os.kill(cluster.procs[name].pid, signal.SIGHUP)
    wait_for(lambda: not (cluster.children(name) & old), timeout=timeout, what=f"gunicorn {name}'s old workers to exit")
    old_gone = time.monotonic()
    wait_for(
        lambda: log_count(cluster, name, WEB_WORKER_READY) >= readies + cluster.web_workers,
        timeout=timeout,
        what=f"gunicorn {name}'s new workers to be ready",
    )
    assert cluster.procs[name].poll() is None, f"gunicorn's master exited on HUP:\n{cluster.logs(name)}"
    # The master keeps running: no exit code; the stop time is its old workers'.
    stopped = Stopped(name, seconds=old_gone - began, returncode=None, leftovers=0)
    return Restart(how=f"{name}: HUP (graceful reload)", stopped=stopped, began=began, ready=time.monotonic())


def reload_gunicorn_gapless(cluster: Cluster, name: str = "web", *, timeout: float = 60) -> Restart:
    """Reload gunicorn's workers without a gap: TTIN once per worker, wait until the new ones are ready, then TTOU
    as often, which stops the oldest (gracefully, like HUP does). New workers load the application from disk.

    The stop time is the old workers': from the first TTOU until the last of them exited.
    """
    master = cluster.procs[name].pid
    old = cluster.children(name)
    readies = log_count(cluster, name, WEB_WORKER_READY)
    began = time.monotonic()
    # One signal at a time: two of a kind sent before the master handles the first are delivered as one.
    for count in range(1, len(old) + 1):
        os.kill(master, signal.SIGTTIN)
        wait_for(
            lambda count=count: log_count(cluster, name, WEB_WORKER_READY) >= readies + count,
            timeout=timeout,
            what=f"gunicorn {name}'s new worker to be ready",
        )
    stopping = time.monotonic()
    for count in range(1, len(old) + 1):
        os.kill(master, signal.SIGTTOU)
        wait_for(
            lambda count=count: len(cluster.children(name) & old) <= len(old) - count,
            timeout=timeout,
            what=f"gunicorn {name}'s oldest worker to exit",
        )
    stopped = Stopped(name, seconds=time.monotonic() - stopping, returncode=None, leftovers=0)
    assert len(cluster.children(name)) == len(old), f"gunicorn {name} did not end with as many workers as it had"
    return Restart(how=f"{name}: TTIN, TTOU (gapless reload)", stopped=stopped, began=began, ready=time.monotonic())


def restart_behind_other(cluster: Cluster, backends: Backends, name: str, *, timeout: float = 60) -> Restart:
    """Take one gunicorn out of the clients' rotation, SIGTERM it, start it, and put it back once every worker is
    ready (a load balancer's drain, and its health check)."""
    url = cluster.web_urls[name]
    began = time.monotonic()
    backends.drain(url)
    stopped = cluster.terminate(name, timeout=timeout)
    readies = log_count(cluster, name, WEB_WORKER_READY)
    cluster.start(name)
    wait_for(
        lambda: log_count(cluster, name, WEB_WORKER_READY) >= readies + cluster.web_workers,
        timeout=timeout,
        what=f"gunicorn {name}'s workers to be ready",
    )
    backends.undrain(url)
    return Restart(
        how=f"{name}: drained, SIGTERM, start, back in rotation", stopped=stopped, began=began, ready=time.monotonic()
    )


def restart_mid_nightly_run(
    cluster: Cluster,
    day: str,
    *,
    spark_master_after: str,
    timeout: float = 120,
    while_stopped: Callable[[], object] = lambda: None,
) -> Restart:
    """Start a nightly run for `day` on the analytics worker, SIGTERM the worker while it runs, and start it again.

    The worker's environment should hold the run in progress (a Spark master that does not answer, say); the
    worker is started again with `spark_master_after`, and runs the requeued day.
    """
    from analytics.models import NightlyRun
    from config.celery import app

    running = NightlyRun.objects.filter(date=day, status=NightlyRun.Status.RUNNING)
    app.send_task("analytics.run_nightly", kwargs={"date": day})
    wait_for(
        running.exists, timeout=timeout, what="the nightly run to start", details=lambda: cluster.logs("analytics")
    )
    cluster.process_env.setdefault("analytics", {})["SPARK_MASTER"] = spark_master_after
    return restart(cluster, "analytics", timeout=timeout, while_stopped=while_stopped)


def steady_p99(restarts: list[Restart], ledger: Ledger) -> float:
    """Return the order p99 before the first restart, after the warm-up; 0 when too few orders were acknowledged."""
    with ledger.lock:
        first = min((at for at, _ in ledger.latencies), default=math.inf)
    began = min((item.began for item in restarts), default=-math.inf)
    p99, count = ledger.latency_p99(since=first + WARM_UP_SECONDS, until=began)
    return p99 if count >= 2 else 0.0


def clean_restart_problems(restarts: list[Restart], ledger: Ledger, *, p99_limit: float) -> list[str]:
    """Return what went wrong in these restarts: a process that did not exit 0 on its own or left processes
    behind, no order acknowledged meanwhile, an order p99 over the limit, a 5xx or a connection error.

    The limit grows to LATENCY_NOISE_FACTOR times the steady p99 before the first restart when that is larger: on a
    machine already slow before any restart, the restart must not make orders slower than its noise.
    """
    problems = []
    p99_limit = max(p99_limit, LATENCY_NOISE_FACTOR * steady_p99(restarts, ledger))
    for item in restarts:
        if item.stopped.returncode not in (0, None) or item.stopped.seconds == math.inf:
            problems.append(f"{item.how}: exit {item.stopped.returncode} after {item.stopped.seconds:.1f} s")
        if item.stopped.leftovers:
            problems.append(f"{item.how}: {item.stopped.leftovers} processes left behind")
        p99, count = item.latency_p99(ledger)
        if count == 0:
            problems.append(f"{item.how}: no order acknowledged meanwhile (not under load)")
        elif p99 > p99_limit:
            problems.append(f"{item.how}: order p99 {p99 * 1000:.1f} ms")
        if failed := item.failed_answers(ledger):
            problems.append(
                f"{item.how}: {len(failed)} 5xx or connection errors: {sorted({w for _, w in failed}, key=str)}"
            )
    return problems


def assert_clean_restart(restarts: list[Restart], ledger: Ledger, *, p99_limit: float) -> None:
    """Fail unless every process exited 0 on its own, left nothing behind, and orders stayed fast and answered."""
    problems = clean_restart_problems(restarts, ledger, p99_limit=p99_limit)
    assert not problems, problems
    failures = {status: n for status, n in ledger.statuses.items() if status != 201}
    assert failures == {}, f"answers other than 201 during the restarts: {failures}"
