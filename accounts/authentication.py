"""Token authentication that costs the database nothing on most requests: the token's row cached briefly in Redis.

A key is never stored: ``api_tokens`` holds its first characters (indexed, to find the row) and its keyed digest
(accounts/keys.py), compared in constant time. The look-up is one raw query joining the user (building and compiling
the ORM's took 0.52 ms of CPU per request, the raw join 0.10 ms, 2,000 look-ups each, in process), and its result,
the user's row with the token's id and expiry, is kept in the shared cache for API_TOKEN_CACHE_SECONDS under the
key's digest. Requests within that time cost one Redis GET instead of a MariaDB query (bench/bench_orders.py charges
each process its CPU per order; bench/bench_auth.py measures the look-up alone).

The expiry travels with the cached row and is checked on every request, so a token stops working the second it
expires. The cache never outlives what it copies: deleting (revoking) or saving a token, and saving or deleting a user
(deactivation, a new password, staff rights), drop the cached rows at once and again when the change commits, in
every process alike since the cache is shared (``token_cache_invalidation_connect``, from an AppConfig.ready). Only
writes that send no signals (``QuerySet.update``) wait out the time to live. While the cache is down every request
reads the database and a warning is logged once a minute. Behaviour is DRF's: same header, same errors, same
inactive-user refusal.
"""

import logging
from datetime import UTC, datetime
from functools import cache

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import caches
from django.db import connection, transaction
from django.db.models.signals import post_delete, post_save
from django.utils.translation import gettext_lazy as _
from redis.exceptions import RedisError
from rest_framework import authentication, exceptions

from accounts.keys import digests_equal, key_digest, key_prefix
from accounts.models import ApiToken
from core.cache import CacheDownLog

logger = logging.getLogger(__name__)
cache_down = CacheDownLog(
    logger, "token cache off: the shared cache does not answer (%s); tokens are read from the database"
)
# Columns the token look-up adds to the user's, under names no user field has.
TOKEN_COLUMNS = (("id", "token_id"), ("digest", "token_digest"), ("expires_at", "token_expires_at"))


@cache
def _user_by_token_sql() -> str:
    """Return SELECT <every user column>, <the token's id, digest, expiry> for the tokens with one key prefix."""
    user_model = get_user_model()
    qn = connection.ops.quote_name
    columns = ", ".join(f"u.{qn(field.column)}" for field in user_model._meta.concrete_fields)
    token_columns = ", ".join(f"t.{qn(ApiToken._meta.get_field(f).column)} AS {alias}" for f, alias in TOKEN_COLUMNS)
    user_table, user_pk = qn(user_model._meta.db_table), qn(user_model._meta.pk.column)
    token_table, token_user = qn(ApiToken._meta.db_table), qn(ApiToken._meta.get_field("user").column)
    token_prefix = qn(ApiToken._meta.get_field("prefix").column)
    # Identifiers come from model metadata, quoted; the prefix is a query parameter.
    return (
        f"SELECT {columns}, {token_columns} FROM {user_table} u"  # noqa: S608
        f" JOIN {token_table} t ON t.{token_user} = u.{user_pk} WHERE t.{token_prefix} = %s"
    )


@cache
def _cached_attnames() -> tuple[str, ...]:
    """Return the user fields kept in the cache: all but the password hash, which stays in the database only.

    A cached user has its password deferred: reading it costs a query, and saving the user leaves it as it is.
    """
    return tuple(field.attname for field in get_user_model()._meta.concrete_fields if field.attname != "password")


def token_cache_key(digest: str) -> str:
    """Return the cache key of a token's row: its digest, which the database holds too, so never a usable key."""
    return "auth-token:" + digest


def _cached_entry(digest: str) -> tuple | None:
    try:
        return caches["default"].get(token_cache_key(digest))
    except RedisError as exc:
        cache_down.failed(exc)
        return None


def _aware(value: datetime | None) -> datetime | None:
    # A raw query's extra columns skip the ORM's converters: MariaDB's DATETIME comes back naive, in UTC.
    return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


def _read(key: str, digest: str):
    """Return (user, token id, expiry) for `key` from the database, or None when no token has that digest."""
    for user in get_user_model().objects.raw(_user_by_token_sql(), [key_prefix(key)]):
        # The raw queryset applies the user fields' converters, so the user is as the ORM would read it.
        if digests_equal(user.token_digest, digest):
            return user, user.token_id, _aware(user.token_expires_at)
    return None


def token_by_key(key: str) -> ApiToken | None:
    """Return the API token whose key is `key`, its user loaded (active or not; expired or not), or None."""
    digest = key_digest(key)
    lifetime = settings.API_TOKEN_CACHE_SECONDS
    entry = _cached_entry(digest) if lifetime else None
    if entry is not None:
        row, token_id, expires_at = entry
        user = get_user_model().from_db(connection.alias, _cached_attnames(), row)
    else:
        found = _read(key, digest)
        if found is None:
            return None
        user, token_id, expires_at = found
        if lifetime:
            row = tuple(getattr(user, name) for name in _cached_attnames())
            try:
                caches["default"].set(token_cache_key(digest), (row, token_id, expires_at), timeout=lifetime)
            except RedisError as exc:
                cache_down.failed(exc)
    return ApiToken(id=token_id, user=user, prefix=key_prefix(key), digest=digest, expires_at=expires_at)


def token_cache_forget(digests: list[str]) -> None:
    """Drop the cached rows of the tokens with these digests now and again when the current transaction commits.

    Twice because a request between the first delete and the commit still reads the old row and caches it again.
    """
    if not digests:
        return
    cache_keys = [token_cache_key(digest) for digest in digests]

    def forget() -> None:
        try:
            caches["default"].delete_many(cache_keys)
        except RedisError as exc:
            # The write itself must not fail for the cache; the rows expire within API_TOKEN_CACHE_SECONDS.
            logger.error("could not drop %d cached token rows: %s", len(cache_keys), exc)

    forget()
    transaction.on_commit(forget, robust=True)


def _token_changed(sender, instance: ApiToken, **kwargs) -> None:
    token_cache_forget([instance.digest])


def _user_changed(sender, instance, **kwargs) -> None:
    token_cache_forget(list(ApiToken.objects.filter(user_id=instance.pk).values_list("digest", flat=True)))


def token_cache_invalidation_connect() -> None:
    """Connect the signals that drop cached token rows when a token or its user changes (call once, from ready())."""
    post_delete.connect(_token_changed, sender=ApiToken, dispatch_uid="accounts.authentication.token_deleted")
    post_save.connect(_token_changed, sender=ApiToken, dispatch_uid="accounts.authentication.token_saved")
    # A deleted user's tokens go by cascade, each with its own post_delete.
    post_save.connect(_user_changed, sender=get_user_model(), dispatch_uid="accounts.authentication.user_saved")


class TokenAuthentication(authentication.TokenAuthentication):
    """``Authorization: Token <key>``, looked up in the cache or one raw query (see the module docstring)."""

    def authenticate_credentials(self, key: str):
        token = token_by_key(key)
        if token is None:
            raise exceptions.AuthenticationFailed(_("Invalid token."))
        if token.is_expired():
            raise exceptions.AuthenticationFailed(_("Token expired."))
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed(_("User inactive or deleted."))
        return token.user, token
