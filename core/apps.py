"""core as an installed app: its templates, and the database deadlines of Celery workers (core/deadlines.py)."""

from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "core"

    def ready(self) -> None:
        from celery import signals

        from core.deadlines import worker_deadlines_apply

        # Sent once the worker knows its queues, before its pool starts: pool processes inherit the settings.
        signals.worker_init.connect(worker_deadlines_apply, weak=False)
