"""Accounts app: API tokens stored only as digests, with a name and an optional expiry."""

from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "accounts"

    def ready(self) -> None:
        from django.contrib import admin
        from rest_framework.authtoken.models import TokenProxy

        from accounts.authentication import token_cache_invalidation_connect

        # The API authenticates with tokens cached in Redis; any process that changes a token or a user drops them.
        token_cache_invalidation_connect()
        # DRF's authtoken app stays installed for one release (its table holds the keys the data migration hashed,
        # for old processes during a rolling deploy); its admin page would show those keys in plain text.
        if admin.site.is_registered(TokenProxy):
            admin.site.unregister(TokenProxy)
