"""Credits app: the idempotent consumer that awards credits per order."""

from django.apps import AppConfig


class CreditsConfig(AppConfig):
    name = "credits"

    def ready(self) -> None:
        # Register the consumer's metrics in every process, so /metrics lists them even before the first event.
        from credits import metrics  # noqa: F401
