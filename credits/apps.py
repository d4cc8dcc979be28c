"""Credits app: the idempotent consumer that awards credits per order."""

from django.apps import AppConfig


class CreditsConfig(AppConfig):
    name = "credits"

    def ready(self) -> None:
        from core import metrics
        from credits.metrics import OpenDeadLettersCollector, VersionQueuesCollector, counters_initialize

        # Every counter series exists at zero from the first scrape of any process; the open dead letters are
        # counted in the database, and the version queues read from the broker, at scrape time.
        counters_initialize()
        metrics.collector_register(OpenDeadLettersCollector())
        metrics.collector_register(VersionQueuesCollector())
