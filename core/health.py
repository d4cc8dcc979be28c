"""The /healthz probe: 200 when the database and the broker answer, 503 naming what failed; plus what apps report.

The same checks are exported to Prometheus as ``creditshop_dependency_up`` (``DependencyCollector``, read by /metrics).
The credits service's database is reported but does not fail the probe: orders are still taken while it is down
(their credits follow when it returns), so a load balancer must keep sending them. Apps add informational sections
(the outbox its backlog) with ``section_register`` from their AppConfig.ready.
"""

from collections.abc import Callable

from django.conf import settings
from django.db import connections
from django.http import HttpRequest, JsonResponse
from kombu import Connection
from prometheus_client.core import GaugeMetricFamily

from core.broker import connection_ensure

BROKER_TIMEOUT_SECONDS = 2.0

# Section name -> a function returning that section's report, read from the orders database.
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
    return None


def check_broker() -> str | None:
    try:
        with Connection(settings.CELERY_BROKER_URL, connect_timeout=BROKER_TIMEOUT_SECONDS) as conn:
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
        for name, check in DEPENDENCIES.items():
            up.add_metric([name], 0.0 if check() else 1.0)
        yield up


def healthz(request: HttpRequest) -> JsonResponse:
    """Report whether the database and the broker answer."""
    checks = {"database": check_database(), "broker": check_broker()}
    failed = {name: error for name, error in checks.items() if error}
    checks["credits_database"] = check_database("credits")
    body = {"status": "ok" if not failed else "unavailable", "checks": {n: e or "ok" for n, e in checks.items()}}
    if not checks["database"]:
        # Informational: a backlog is the relay's problem to report, not a reason to take this process out of service.
        body.update({name: report() for name, report in _sections.items()})
    return JsonResponse(body, status=503 if failed else 200)
