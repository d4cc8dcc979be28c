"""Orders app: order placement written atomically with its outbox message."""

from django.apps import AppConfig


class OrdersConfig(AppConfig):
    name = "orders"
