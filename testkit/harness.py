"""Fault-injection harness: real gunicorn, Celery workers, beat and relay, clients that retry, and a reconciliation.

Used by the short CI suite (tests/reliability/) and the long soak (bench/soak.py). Every process runs in its own
process group so a fault can SIGKILL exactly what it means to, and `Cluster.stop()` leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import requests

from testkit.processes import stop_processes

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


# How much slower than the steady orders before a fault the orders during it may be, on a machine too busy to show
# a fixed limit (other runs sharing its two cores): p99 over a few hundred orders swings up to twice from one window
# to the next there. A stall for a retry or a connect timeout still crosses it.
LATENCY_NOISE_FACTOR = 3


@dataclass
class Ledger:
    """What the clients asked for and what the service acknowledged."""

    attempted: int = 0
    acknowledged: dict[str, tuple[int, int]] = field(default_factory=dict)  # key -> (order id, total)
    statuses: Counter = field(default_factory=Counter)
    server_errors: list[tuple[float, int]] = field(default_factory=list)  # (time, status)
    connection_errors: list[tuple[float, str]] = field(default_factory=list)  # (time, REFUSED or "connection error")
    # (time acknowledged, seconds from the order's first attempt to its 201, retries included)
    latencies: list[tuple[float, float]] = field(default_factory=list)
    gave_up: int = 0
    # (time answered or failed, seconds the request took, status or connection error): every attempt, retries apart.
    requests: list[tuple[float, float, int | str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def latency_p99(self, *, since: float = -math.inf, until: float = math.inf) -> tuple[float, int]:
        """Return the p99 latency in seconds of the orders acknowledged in [since, until], and how many there were."""
        with self.lock:
            window = [seconds for at, seconds in self.latencies if since <= at <= until]
        if len(window) < 2:
            return (window[0] if window else math.nan), len(window)
        return statistics.quantiles(window, n=100, method="inclusive")[98], len(window)


class Backends:
    """The web instances a client sends to, in turn; a drained one gets no new request (a load balancer's drain)."""

    def __init__(self, *urls: str):
        self.urls = list(urls)
        self.drained: set[str] = set()
        self._turn = itertools.count()
        self._lock = threading.Lock()

    def next(self) -> str:
        with self._lock:
            serving = [url for url in self.urls if url not in self.drained]
            return serving[next(self._turn) % len(serving)]

    def drain(self, url: str) -> None:
        with self._lock:
            if len(self.drained | {url}) == len(self.urls):
                raise ValueError("cannot drain the last serving instance")
            self.drained.add(url)

    def undrain(self, url: str) -> None:
        with self._lock:
            self.drained.discard(url)


class OrderStream:
    """Client threads placing orders at a steady rate, each retrying with its Idempotency-Key until answered.

    Requests go to `backends` in turn (one URL, or several web instances); a refused connection is counted apart
    from other connection errors.
    """

    def __init__(self, backends: str | Backends, tokens: list[str], *, rate: float, ledger: Ledger, seed: int = 1):
        self.backends = Backends(backends) if isinstance(backends, str) else backends
        self.tokens, self.rate, self.ledger = tokens, rate, ledger
        self.stop_event = threading.Event()
        self.random = random.Random(seed)
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(len(tokens))]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(timeout=120)

    def _run(self, slot: int) -> None:
        session = requests.Session()
        session.headers["Authorization"] = f"Token {self.tokens[slot]}"
        interval = len(self.tokens) / self.rate
        next_at = time.monotonic()
        while not self.stop_event.is_set():
            self._place(session, total=self.random.randint(1, 50))
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))

    def _place(self, session: requests.Session, *, total: int) -> None:
        key = uuid.uuid4().hex
        body = {"goods_name": "reliability", "total": total}
        with self.ledger.lock:
            self.ledger.attempted += 1
        first_attempt = time.monotonic()
        deadline = first_attempt + 120
        while time.monotonic() < deadline:
            sent = time.monotonic()
            try:
                response = session.post(
                    f"{self.backends.next()}/api/orders/", json=body, headers={"Idempotency-Key": key}, timeout=10
                )
            except requests.RequestException as exc:
                kind = REFUSED if _refused(exc) else "connection error"
                with self.ledger.lock:
                    self.ledger.statuses[kind] += 1
                    self.ledger.connection_errors.append((time.monotonic(), kind))
                    self.ledger.requests.append((time.monotonic(), time.monotonic() - sent, kind))
                time.sleep(0.2)
                continue
            with self.ledger.lock:
                self.ledger.requests.append((time.monotonic(), time.monotonic() - sent, response.status_code))
                self.ledger.statuses[response.status_code] += 1
                if response.status_code >= 500:
                    self.ledger.server_errors.append((time.monotonic(), response.status_code))
            if response.status_code == 201:
                answered = time.monotonic()
                with self.ledger.lock:
                    self.ledger.acknowledged[key] = (response.json()["id"], total)
                    self.ledger.latencies.append((answered, answered - first_attempt))
                return
            time.sleep(0.2)
        with self.ledger.lock:
            self.ledger.gave_up += 1


class HealthProbe:
    """A load balancer's health check: GET /healthz every half second, each answer and its time kept."""

    def __init__(self, base_url: str):
        self.base_url = base_url
        self.answers: list[tuple[float, float, int | str, dict]] = []  # (time, seconds, status or error, body)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            sent = time.monotonic()
            try:
                response = requests.get(f"{self.base_url}/healthz", timeout=10)
                outcome, body = response.status_code, response.json()
            except (requests.RequestException, ValueError) as exc:
                outcome, body = type(exc).__name__, {}
            self.answers.append((time.monotonic(), time.monotonic() - sent, outcome, body))
            self._stop.wait(0.5)


REFUSED = "connection refused"


def _refused(exc: BaseException) -> bool:
    """Tell whether a request failed because nothing accepted the connection (ECONNREFUSED somewhere in its causes)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError) or "Connection refused" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__ or getattr(seen, "reason", None)
    return False


@dataclass
class Reconciliation:
    attempted: int
    acknowledged: int
    stored: int
    lost: int
    unacknowledged_stored: int
    credited: int
    missing_credits: int
    duplicated_credits: int
    wrong_amounts: int
    balance_mismatches: int
    gave_up: int
    # Dead letters recorded for these orders: none of the injected faults is a message's fault.
    dead_letters: int = 0

    @property
    def ok(self) -> bool:
        return not (
            self.lost
            or self.missing_credits
            or self.duplicated_credits
            or self.wrong_amounts
            or self.balance_mismatches
            or self.gave_up
        )

    def assert_nothing_lost_or_duplicated(self, *, logs: str = "") -> None:
        """Fail unless every acknowledged order was stored and credited once, with the right amount and balance."""
        wrong = {
            name: getattr(self, name)
            for name in (
                "lost",
                "gave_up",
                "unacknowledged_stored",
                "missing_credits",
                "duplicated_credits",
                "wrong_amounts",
                "balance_mismatches",
            )
            if getattr(self, name)
        }
        assert wrong == {}, f"{self}\n{logs}"


def reconcile(ledger: Ledger, user_ids: list[int]) -> Reconciliation:
    """Compare what clients were told with what each service's database holds (orders; credits, balances)."""
    from django.db import connections

    placeholders = ",".join(["%s"] * len(user_ids))
    with connections["default"].cursor() as cursor:
        cursor.execute(f"SELECT id, total FROM orders WHERE user_id IN ({placeholders})", user_ids)  # noqa: S608
        orders = dict(cursor.fetchall())
    with connections["credits"].cursor() as cursor:
        cursor.execute(
            f"SELECT order_id, COUNT(*), SUM(total) FROM order_credits WHERE user_id IN ({placeholders})"  # noqa: S608
            " GROUP BY order_id",
            user_ids,
        )
        credits = {order_id: (count, total) for order_id, count, total in cursor.fetchall()}
        balance_sql = (
            "SELECT b.user_id, b.balance, COALESCE(SUM(c.total), 0) FROM credit_balances b"
            " LEFT JOIN order_credits c ON c.user_id = b.user_id"
            f" WHERE b.user_id IN ({placeholders}) GROUP BY b.user_id, b.balance"
        )
        cursor.execute(balance_sql, user_ids)
        balance_mismatches = sum(1 for _, balance, entries in cursor.fetchall() if balance != entries)
        order_placeholders = ",".join(["%s"] * len(orders)) or "NULL"
        cursor.execute(
            f"SELECT COUNT(*) FROM credit_dead_letters WHERE order_id IN ({order_placeholders})",  # noqa: S608
            list(orders),
        )
        (dead_letters,) = cursor.fetchone()

    acknowledged_ids = {order_id for order_id, _ in ledger.acknowledged.values()}
    return Reconciliation(
        attempted=ledger.attempted,
        acknowledged=len(ledger.acknowledged),
        stored=len(orders),
        lost=len(acknowledged_ids - set(orders)),
        unacknowledged_stored=len(set(orders) - acknowledged_ids),
        credited=len(credits),
        missing_credits=len(set(orders) - set(credits)),
        duplicated_credits=sum(count - 1 for count, _ in credits.values()),
        wrong_amounts=sum(1 for oid, (_, total) in credits.items() if oid in orders and total != 2 * orders[oid]),
        balance_mismatches=balance_mismatches,
        gave_up=ledger.gave_up,
        dead_letters=dead_letters,
    )


def wait_for_credits(ledger: Ledger, user_ids: list[int], *, timeout: float) -> tuple[Reconciliation, float]:
    """Poll until every stored order has its credit or the timeout passes; return the result and the time taken."""
    from django.db import connections

    started = time.monotonic()
    while True:
        for alias in ("default", "credits"):
            connections[alias].close()
        result = reconcile(ledger, user_ids)
        if result.missing_credits == 0 or time.monotonic() - started > timeout:
            return result, time.monotonic() - started
        time.sleep(0.5)


def wait_until_credited(order_ids: set[int], *, timeout: float) -> float:
    """Poll the credits database until every one of these orders has its credit; return the seconds it took."""
    from django.db import connections

    started = time.monotonic()
    connection = connections["credits"]
    placeholders = ",".join(["%s"] * len(order_ids)) or "NULL"
    while time.monotonic() - started < timeout:
        connection.close()  # after a fault, a connection from before it may be gone
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT COUNT(*) FROM order_credits WHERE order_id IN ({placeholders})", list(order_ids))
            if cursor.fetchone()[0] == len(order_ids):
                break
        time.sleep(0.25)
    return time.monotonic() - started


def wait_until_published(*, timeout: float) -> int:
    """Poll the outbox until no row is left to publish (pending, or dead) or the timeout passes; return how many are.

    A relay killed between a batch's publish and its mark leaves its rows pending, leased, until the lease runs out
    and another relay publishes them again (the consumer absorbs the duplicates): the credits can all be there while
    the outbox still holds rows it will send.
    """
    from django.db import connections

    from outbox.models import TransactionLog

    unsent = (TransactionLog.Status.PENDING, TransactionLog.Status.DEAD)
    deadline = time.monotonic() + timeout
    while True:
        connections["default"].close()  # after a fault, a connection from before it may be gone
        left = TransactionLog.objects.filter(status__in=unsent).count()
        if left == 0 or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def kill_database_connections(database: str) -> int:
    """KILL every server connection to a database except this process's own; return how many were killed."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT CONNECTION_ID()")
        (own,) = cursor.fetchone()
        cursor.execute("SELECT id FROM information_schema.processlist WHERE db = %s AND id <> %s", [database, own])
        ids = [row[0] for row in cursor.fetchall()]
        killed = 0
        for thread_id in ids:
            try:
                cursor.execute(f"KILL CONNECTION {int(thread_id)}")
                killed += 1
            except Exception:  # noqa: S110 (the connection may have closed on its own meanwhile)
                pass
    return killed
