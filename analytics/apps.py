"""Analytics app: nightly Spark jobs, consistency checks and their reports."""

from django.apps import AppConfig


class AnalyticsConfig(AppConfig):
    name = "analytics"

    def ready(self) -> None:
        from analytics.metrics import NightlyRunCollector
        from core import metrics

        # The nightly run's verdict is read from its history table at scrape time, by any web process.
        metrics.collector_register(NightlyRunCollector())
