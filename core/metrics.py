"""The Prometheus /metrics endpoint.

Relay counters (published, failed, dead) are incremented in whichever process relays: Celery workers and
``relay_outbox``. With PROMETHEUS_MULTIPROC_DIR set (one shared directory per host, wiped at deploy), every process
writes its counters there and this view sums them, so one scrape covers the host. Without it the view reports
this process's own counters only. The gauges (outbox lag and dead rows, open credit dead letters, the health of what
the service depends on) do not depend on that: they are read at scrape time, so every replica reports the same, true
value and nothing is lost when a relay restarts. Apps hand them over with ``collector_register`` from their
AppConfig.ready; they are registered on the registry built for each scrape, never on the default one, which the
multiprocess collector does not read.
"""

import hmac
import os

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from core.health import DependencyCollector

# Collectors that read the database at scrape time, added by the apps.
_scrape_collectors: list[Collector] = []


def collector_register(collector: Collector) -> None:
    """Add a collector read at every scrape of /metrics (a gauge computed from the database)."""
    _scrape_collectors.append(collector)


class _ProcessCounters:
    """This process's default registry, as one collector of a per-scrape registry."""

    def collect(self):
        return REGISTRY.collect()


def build_registry(*, multiprocess_dir: str | None = None) -> CollectorRegistry:
    """Return a registry holding the relay counters (summed across processes if a directory is given) and gauges."""
    registry = CollectorRegistry(auto_describe=False)
    if multiprocess_dir:
        MultiProcessCollector(registry, path=multiprocess_dir)
    else:
        registry.register(_ProcessCounters())
    registry.register(DependencyCollector())
    for collector in _scrape_collectors:
        registry.register(collector)
    return registry


def scraper_authorized(request: HttpRequest) -> bool:
    """Return whether the request may read /metrics: any caller without METRICS_TOKEN, else its bearer only."""
    token = settings.METRICS_TOKEN
    if not token:
        return True
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    # Constant time, so the token cannot be guessed a character at a time from response times.
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


def metrics(request: HttpRequest) -> HttpResponse:
    """Expose the outbox and credits metrics in the Prometheus text format."""
    if not scraper_authorized(request):
        response = HttpResponse("Authorization: Bearer <METRICS_TOKEN> required.\n", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    registry = build_registry(multiprocess_dir=os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None)
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
