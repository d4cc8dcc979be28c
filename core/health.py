"""The /healthz probe: 200 when the database and the broker answer, 503 naming what failed; plus what apps report.

The same checks are exported to Prometheus as ``creditshop_dependency_up`` (``DependencyCollector``, read by /metrics).
The credits service's database and the shared cache are reported but do not fail the probe: orders are still taken
while either is down (credits follow when it returns; the rate limit fails open), so a load balancer must keep sending
them. Apps add informational sections (the outbox its backlog) with ``section_register`` from their AppConfig.ready.

The probe answers within 2 s whatever hangs behind it, once a web thread takes it (docs/OPERATIONS.md, "When a database
or Redis goes silent", on the first seconds of a silence): the dependencies are checked and the sections read at once,
each in a thread of its own, and one that has not answered within PROBE_DEADLINE_SECONDS is reported as not answering,
by name. A section is read even while its check runs, since the database can go silent between the two: a section
that fails or does not answer in time reports its error, never the probe's. A check or section left running ends at
its own client's deadline (core/deadlines.py for the databases, the broker's connect timeout, the cache's socket
timeout), so a silent dependency holds at most a few of the pool's threads for a few seconds.
"""

import concurrent.futures
import time
from collections.abc import Callable

from django.conf import settings
from django.core.cache import caches
from django.db import connections
from django.http import HttpRequest, JsonResponse
from kombu import Connection
from prometheus_client.core import GaugeMetricFamily

from core.broker import connection_ensure
from core.cache import shared_client

# The longest a check is waited for; with the rest of the request /healthz answers within 2 s.
PROBE_DEADLINE_SECONDS = 1.5
BROKER_TIMEOUT_SECONDS = PROBE_DEADLINE_SECONDS
# Checks left running on a silent dependency hold a thread each until their client's deadline; a probe every second
# from a load balancer, with the web's deadlines (3 s at most), holds a handful.
_checks = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="healthz")

# Section name -> a function returning that section's report, read from the orders database (in a pool thread).
_sections: dict[str, Callable[[], dict]] = {}


def section_register(name: str, report: Callable[[], dict]) -> None:
    """Add an informational section to /healthz, reported while the orders database answers."""
    _sections[name] = report


def check_database(alias: str = "default") -> str | None:
    try:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:  # any failure means unhealthy; the message says which
        return f"{type(exc).__name__}: {exc}"
    finally:
        # Run in a pool thread, where no request ends to close or reuse the connection.
        connections[alias].close()
    return None


def check_cache() -> str | None:
    try:
        shared_client(caches["default"]).ping()
    except Exception as exc:  # redis-py raises its own errors and OSErrors
        return f"{type(exc).__name__}: {exc}"
    return None


def check_broker() -> str | None:
    try:
        # The handshake's reads get the same deadline as the connect: a broker that accepts and then says nothing
        # would otherwise hold the check's thread for ever.
        deadlines = {"read_timeout": BROKER_TIMEOUT_SECONDS, "write_timeout": BROKER_TIMEOUT_SECONDS}
        with Connection(
            settings.CELERY_BROKER_URL, connect_timeout=BROKER_TIMEOUT_SECONDS, transport_options=deadlines
        ) as conn:
            # Any one node of a cluster answering is enough: clients fail over to it.
            connection_ensure(conn, timeout=BROKER_TIMEOUT_SECONDS)
    except Exception as exc:  # kombu raises transport-specific errors
        return f"{type(exc).__name__}: {exc}"
    return None


# What /metrics reports as up or down, each checked at scrape time: dependency name -> check returning an error or None.
DEPENDENCIES: dict[str, Callable[[], str | None]] = {
    "database": check_database,
    "credits_database": lambda: check_database("credits"),
    "broker": check_broker,
    "cache": check_cache,
}
# Those a web process cannot take orders without: one down makes /healthz answer 503.
REQUIRED = ("database", "broker")


def _unanswered(name: str) -> str:
    return f"no answer within {PROBE_DEADLINE_SECONDS:g} s (the {name} is silent, or too slow)"


def checks_run(names=tuple(DEPENDENCIES)) -> dict[str, str | None]:
    """Run the named checks at once and return each one's error (None: it answered), waiting PROBE_DEADLINE_SECONDS
    at most: a check still running then is reported as not answering."""
    futures = {name: _checks.submit(DEPENDENCIES[name]) for name in names}
    concurrent.futures.wait(futures.values(), timeout=PROBE_DEADLINE_SECONDS)
    return {name: future.result() if future.done() else _unanswered(name) for name, future in futures.items()}


def _section_read(report: Callable[[], dict]) -> dict:
    try:
        return report()
    except Exception as exc:  # informational: the section says what failed, the probe still answers
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        # Run in a pool thread, where no request ends to close or reuse the connection.
        connections["default"].close()


def _probe() -> tuple[dict[str, str | None], dict[str, dict]]:
    """Run every check and read every section at once, within one PROBE_DEADLINE_SECONDS."""
    deadline = time.monotonic() + PROBE_DEADLINE_SECONDS
    sections = {name: _checks.submit(_section_read, report) for name, report in _sections.items()}
    checks = checks_run()
    concurrent.futures.wait(sections.values(), timeout=max(0.0, deadline - time.monotonic()))
    return checks, {
        name: future.result() if future.done() else {"error": _unanswered("database")}
        for name, future in sections.items()
    }


class DependencyCollector:
    """Report 1 for each dependency that answers right now and 0 for each that does not, checked when scraped."""

    def describe(self):
        return []

    def collect(self):
        up = GaugeMetricFamily(
            "creditshop_dependency_up",
            "Whether this web process reaches a dependency right now (1) or not (0), checked at scrape time.",
            labels=["dependency"],
        )
        for name, error in checks_run().items():
            up.add_metric([name], 0.0 if error else 1.0)
        yield up


def healthz(request: HttpRequest) -> JsonResponse:
    """Report whether each dependency answers; 503 when one the orders need does not, naming it."""
    checks, sections = _probe()
    failed = [name for name in REQUIRED if checks[name]]
    body = {"status": "ok" if not failed else "unavailable", "checks": {n: e or "ok" for n, e in checks.items()}}
    if not checks["database"]:
        # Informational: a backlog is the relay's problem to report, not a reason to take this process out of service.
        body.update(sections)
    return JsonResponse(body, status=503 if failed else 200)
