"""Orders app: order placement written atomically with its outbox message."""

from django.apps import AppConfig


class OrdersConfig(AppConfig):
    name = "orders"

    def ready(self) -> None:
        from core.authentication import token_cache_invalidation_connect

        # The API authenticates with tokens cached in Redis; any process that changes a token or a user drops them.
        token_cache_invalidation_connect()
