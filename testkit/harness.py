"""Fault-injection harness: the service's real processes (gunicorn, Celery workers, beat, the relay) as a cluster.

Used by the short CI suite (tests/reliability/), the benchmarks and the long soak (bench/soak.py). Every process runs
in its own process group so a fault can SIGKILL exactly what it means to, and `Cluster.stop()` leaves nothing
behind. The clients that load it are in testkit/load.py, the reconciliation afterwards in testkit/reconcile.py.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import requests

from testkit.processes import listening, stop_processes

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


@dataclass
class Cluster:
    """The service's processes, started from this checkout against both services' databases and one broker."""

    # Both database URLs and the broker URL (testkit.processes.service_env), given to every process.
    service_env: dict[str, str]
    workdir: Path
    port: int = 18900
    web_workers: int = 2
    # A second gunicorn ("web2") on this port, for restarting one instance while the other serves.
    second_port: int | None = None
    extra_env: dict = field(default_factory=dict)
    # Per process name: variables only that process gets, over the rest (its own database user, say).
    process_env: dict[str, dict[str, str]] = field(default_factory=dict)
    # Per process name: arguments added to its command line (another Celery pool, say).
    process_args: dict[str, list[str]] = field(default_factory=dict)
    # Per process name: the checkout it runs from, when not this one (a release before, testkit/releases.py).
    process_cwd: dict[str, Path] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    # Like systemd's Restart=always: a process that exits on its own is started again, and counted here. Celery's
    # prefork pool can die on reconnecting after its children were killed (celery/celery#9250, "file descriptor is
    # None"); production runs workers under a supervisor, and so does this harness.
    restarts: Counter = field(default_factory=Counter)
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _supervisor: threading.Thread | None = None
    _stopping: threading.Event = field(default_factory=threading.Event)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def web_urls(self) -> dict[str, str]:
        """Return each gunicorn instance's name and base URL."""
        urls = {"web": self.base_url}
        if self.second_port is not None:
            urls["web2"] = f"http://127.0.0.1:{self.second_port}"
        return urls

    def env(self, name: str | None = None) -> dict:
        """Return the environment of the named process (without a name: what every process shares)."""
        env = dict(self.service_env)
        env.update(
            ORDERS_RATE_LIMIT="none",
            OUTBOX_SWEEP_SECONDS="1",
            PROMETHEUS_MULTIPROC_DIR=str(self.workdir / "prometheus"),
            REPORTS_DIR=str(self.workdir / "reports"),
        )
        env.update(self.extra_env)
        env.update(self.process_env.get(name, {}))
        return env

    def commands(self) -> dict[str, list[str]]:
        python = str(VENV_BIN / "python")
        celery = str(VENV_BIN / "celery")
        web = {name: self._gunicorn(url.rpartition(":")[2]) for name, url in self.web_urls.items()}
        return {
            **web,
            "credits": [celery, "-A", "config", "worker", "-Q", "credits", "-c", "2", "-n", "credits@%h", "-l", "INFO"],
            "outbox": [celery, "-A", "config", "worker", "-Q", "outbox", "-c", "1", "-n", "outbox@%h", "-l", "INFO"],
            # The nightly trigger's own worker, as in production: a Spark run never holds the outbox worker.
            "analytics": [
                celery,
                "-A",
                "config",
                "worker",
                "-Q",
                "analytics",
                "-c",
                "1",
                "-n",
                "analytics@%h",
                "-l",
                "INFO",
            ],
            "beat": [celery, "-A", "config", "beat", "-l", "INFO", "-s", str(self.workdir / "beat-schedule")],
            "relay": [python, "manage.py", "relay_outbox"],
        }

    def _gunicorn(self, port: str) -> list[str]:
        return [
            str(VENV_BIN / "gunicorn"),
            "config.wsgi",
            f"--bind=127.0.0.1:{port}",
            f"--workers={self.web_workers}",
            "--threads=4",
        ]

    def start(self, *names: str) -> None:
        (self.workdir / "prometheus").mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        with self._lock:
            for name in names or self.commands():
                self._spawn(name)
        if self._supervisor is None:
            self._supervisor = threading.Thread(target=self._supervise, name="cluster-supervisor", daemon=True)
            self._supervisor.start()
        for name, url in self.web_urls.items():
            if name in (names or self.commands()):
                self.wait_healthy(url)
                self._check_own_listener(name, int(url.rpartition(":")[2]))

    def _check_own_listener(self, name: str, port: int) -> None:
        """Fail unless the gunicorn this cluster started is what listens on its port: a port another process took
        between choosing it and binding it would have this cluster's requests served by that process, silently."""
        with self._lock:
            pid = self.procs[name].pid
        holders = listening(port)
        if pid not in holders:
            raise RuntimeError(f"port {port} of {name} (pid {pid}) is held by other processes: {sorted(holders)}")

    def _spawn(self, name: str) -> None:
        with open(self.workdir / "logs" / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(
                [*self.commands()[name], *self.process_args.get(name, [])],
                cwd=self.process_cwd.get(name, ROOT),
                env=self.env(name),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _supervise(self) -> None:
        while not self._stopping.wait(0.5):
            with self._lock:
                for name, proc in list(self.procs.items()):
                    if proc.poll() is not None:
                        self.restarts[name] += 1
                        self._spawn(name)

    def wait_healthy(self, url: str | None = None, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{url or self.base_url}/healthz", timeout=5).status_code in (200, 503):
                    return
            except requests.RequestException:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"web did not answer within {timeout:.0f}s; see {self.workdir / 'logs'}")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send a signal to a process and everything in its process group (it is not restarted)."""
        with self._lock:
            proc = self.procs.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        proc.wait(timeout=30)

    def terminate(self, name: str, *, sig: int = signal.SIGTERM, timeout: float = 120) -> Stopped:
        """Stop a process as systemd's KillMode=mixed does: `sig` to the main process only, then wait for it to exit.

        Whatever it leaves in its process group after exiting is given a few seconds, then SIGKILLed and counted.
        The process is not restarted.
        """
        with self._lock:
            proc = self.procs.pop(name)
        signalled = time.monotonic()
        proc.send_signal(sig)
        try:
            returncode = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            return Stopped(name, seconds=math.inf, returncode=None, leftovers=0)
        seconds = time.monotonic() - signalled
        return Stopped(name, seconds=seconds, returncode=returncode, leftovers=_reap_group(proc.pid))

    def children(self, name: str) -> set[int]:
        """Return the pids of a process's direct children (a gunicorn master's workers, a Celery worker's pool)."""
        parent = self.procs[name].pid
        return {
            int(pid)
            for pid in subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True).stdout.split()
        }

    def kill_pool_children(self, name: str) -> int:
        """SIGKILL the pool processes of a Celery worker (not the main process, which replaces them)."""
        children = self.children(name)
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(children)

    def stop(self) -> None:
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join(timeout=5)
        stop_processes(*self.procs.values(), group=True)
        self.procs.clear()

    def wait_ready(self, name: str, timeout: float = 60, *, times: int = 1) -> float:
        """Wait until a Celery worker's log says it is ready to consume, the `times`-th time since the cluster's
        first start (its log is kept across restarts); return the seconds waited."""
        started = time.monotonic()
        while self.logs(name, tail=1_000_000).count(" ready.") < times:
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"{name} was not ready within {timeout:.0f}s; see {self.workdir / 'logs'}")
            time.sleep(0.1)
        return time.monotonic() - started

    def logs(self, name: str, tail: int = 40) -> str:
        path = self.workdir / "logs" / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-tail:]) if path.exists() else ""


@dataclass(frozen=True)
class Stopped:
    """How a process stopped: seconds from the signal to its exit, its exit code, processes it left behind."""

    name: str
    seconds: float
    returncode: int | None  # None: it did not exit in time and was SIGKILLed
    leftovers: int


def _reap_group(pgid: int, *, grace: float = 10) -> int:
    """Wait up to `grace` seconds for a process group to empty, then SIGKILL what is left; return how many were."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        left = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True).stdout.split()
        if not left:
            return 0
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    return len(left)
