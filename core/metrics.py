"""The Prometheus /metrics endpoint.

Relay counters (published, failed, dead) are incremented in whichever process relays: Celery workers and
``relay_outbox``. With PROMETHEUS_MULTIPROC_DIR set (one shared directory per host, wiped at deploy), every process
writes its counters there and this view sums them, so one scrape covers the host. Without it the view reports
this process's own counters only. The gauges (outbox lag and dead rows, open credit dead letters) do not depend on
that: they are read from the database at scrape time, so every replica reports the same, true value and nothing is
lost when a relay restarts. Apps hand them over with ``collector_register`` from their AppConfig.ready; they are
registered on the registry built for each scrape, never on the default one, which the multiprocess collector does
not read.
"""

import os

from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

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
    for collector in _scrape_collectors:
        registry.register(collector)
    return registry


def metrics(request: HttpRequest) -> HttpResponse:
    """Expose the outbox and credits metrics in the Prometheus text format."""
    registry = build_registry(multiprocess_dir=os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None)
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
