"""Outbox app: the transaction_log table and the relay that publishes it."""

from django.apps import AppConfig


class OutboxConfig(AppConfig):
    name = "outbox"
