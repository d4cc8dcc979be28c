"""The /healthz probe: 200 when the database and the broker answer, 503 naming what failed; plus outbox backlog.

The credits service's database is reported but does not fail the probe: orders are still taken while it is down
(their credits follow when it returns), so a load balancer must keep sending them.
"""

from django.conf import settings
from django.db import connections
from django.http import HttpRequest, JsonResponse
from kombu import Connection

from config.broker import connection_ensure
from outbox.selectors import outbox_dead_count, outbox_lag_seconds

BROKER_TIMEOUT_SECONDS = 2.0


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


def healthz(request: HttpRequest) -> JsonResponse:
    """Report whether the database and the broker answer."""
    checks = {"database": check_database(), "broker": check_broker()}
    failed = {name: error for name, error in checks.items() if error}
    checks["credits_database"] = check_database("credits")
    body = {"status": "ok" if not failed else "unavailable", "checks": {n: e or "ok" for n, e in checks.items()}}
    if not checks["database"]:
        # Informational: a backlog is the relay's problem to report, not a reason to take this process out of service.
        body["outbox"] = {"lag_seconds": round(outbox_lag_seconds(), 3), "dead": outbox_dead_count()}
    return JsonResponse(body, status=503 if failed else 200)
