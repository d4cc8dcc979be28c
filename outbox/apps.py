"""Outbox app: the transaction_log table and the relay that publishes it."""

from django.apps import AppConfig


class OutboxConfig(AppConfig):
    name = "outbox"

    def ready(self) -> None:
        from core import health, metrics
        from outbox.metrics import OutboxStateCollector
        from outbox.selectors import outbox_dead_count, outbox_lag_seconds

        # /metrics reads the outbox's gauges from the database at scrape time; /healthz reports its backlog.
        metrics.collector_register(OutboxStateCollector())
        health.section_register(
            "outbox", lambda: {"lag_seconds": round(outbox_lag_seconds(), 3), "dead": outbox_dead_count()}
        )
