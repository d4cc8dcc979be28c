"""Prometheus metrics for the outbox: event counters kept by relay processes, state gauges read from the database.

Counters count what a relay did (published, failed, gave up); they live in the process that did it and are summed
across processes by prometheus-client's multiprocess mode when PROMETHEUS_MULTIPROC_DIR is set. Gauges (lag, dead
rows) describe the table, so they are computed from the database at scrape time: any web process answers the same.
"""

import logging

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily

logger = logging.getLogger(__name__)

PUBLISHED = Counter("outbox_published", "Outbox messages confirmed by the broker and marked published.")
FAILED = Counter("outbox_publish_failures", "Outbox publishes nacked, unroutable, timed out or cut off; retried later.")
DEAD = Counter("outbox_dead", "Outbox messages given up after OUTBOX_MAX_ATTEMPTS failed publishes.")


class OutboxStateCollector:
    """Yield the outbox lag and dead-row gauges from the database when scraped."""

    def describe(self):
        return []

    def collect(self):
        from outbox.selectors import outbox_dead_count, outbox_lag_seconds

        try:
            lag, dead = outbox_lag_seconds(), outbox_dead_count()
        except Exception as exc:  # a scrape must still answer (creditshop_dependency_up says the database is down)
            logger.warning("cannot read the outbox gauges: %s", exc)
            return
        yield GaugeMetricFamily(
            "outbox_lag_seconds", "How long the oldest due outbox message has been waiting.", value=lag
        )
        yield GaugeMetricFamily("outbox_dead_messages", "Outbox messages in the dead state.", value=dead)
