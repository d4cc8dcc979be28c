"""Load on a cluster under faults: clients placing orders at a steady rate that retry as a real client would, the
ledger of what they asked for and what was acknowledged, and a probe of the health endpoint."""

from __future__ import annotations

import itertools
import math
import random
import statistics
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import requests

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
