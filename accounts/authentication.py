"""Token authentication that costs the database nothing on most requests: the token's row cached briefly in Redis.

A key is never stored: ``api_tokens`` holds its first characters (indexed, to find the row) and its keyed digest
(accounts/keys.py), compared in constant time. The look-up is one raw query joining the user (building and compiling
the ORM's query costs several times running it: docs/PERFORMANCE.md), and its result,
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

The order request needs the token and a count under its user's rate limit, two Redis round trips; the throttle's key
needs the user, which the token names. Each process remembers which user each token it has seen belongs to (a token
never changes hands; the cached row says whose it is, and is checked), so from a token's second request on, its row
and its user's count come in one round trip (``token_by_key_counted``).
"""

import logging
from datetime import datetime
from functools import cache
from typing import NamedTuple

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import caches
from django.db import connection, transaction
from django.db.models.signals import post_delete, post_save
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from redis.exceptions import RedisError
from rest_framework import authentication, exceptions

from accounts.keys import digests_equal, key_digest, key_prefixes
from accounts.models import ApiToken
from core import sql
from core.cache import CacheDownLog, cache_get
from core.throttling import SharedCacheUserRateThrottle, cached_then_count

logger = logging.getLogger(__name__)
cache_down = CacheDownLog(
    logger, "token cache off: the shared cache does not answer (%s); tokens are read from the database"
)
# The token's columns the look-up reads before the user's: the digest first, compared before anything is converted.
TOKEN_FIELDS = ("digest", "id", "expires_at")
# Tokens whose user a process remembers (token_by_key_counted): the map is emptied when it reaches this many, about a
# megabyte; a token it no longer holds costs its next request one more round trip.
TOKEN_USERS_KEPT = 10_000
_token_users: dict[str, int] = {}


@cache
def _user_by_token_sql() -> str:
    """Return SELECT <the token's digest, id, expiry>, <every user column> for the tokens with a key's prefixes."""
    user_model = get_user_model()
    qn = connection.ops.quote_name
    token_columns = ", ".join(f"t.{qn(ApiToken._meta.get_field(name).column)}" for name in TOKEN_FIELDS)
    columns = ", ".join(f"u.{qn(field.column)}" for field in user_model._meta.concrete_fields)
    user_table, user_pk = qn(user_model._meta.db_table), qn(user_model._meta.pk.column)
    token_table, token_user = qn(ApiToken._meta.db_table), qn(ApiToken._meta.get_field("user").column)
    token_prefix = qn(ApiToken._meta.get_field("prefix").column)
    # Identifiers come from model metadata, quoted; the prefixes (accounts/keys.key_prefixes) are query parameters.
    return (
        f"SELECT {token_columns}, {columns} FROM {token_table} t"  # noqa: S608
        f" JOIN {user_table} u ON u.{user_pk} = t.{token_user} WHERE t.{token_prefix} IN (%s, %s)"
    )


@cache
def _converters() -> tuple[tuple, ...]:
    """Return, per selected column, the (converter, column) pairs the ORM would apply (core/sql.read_converters).

    Applied by hand rather than through a raw queryset, which works them out again on every query: the look-up of
    a row then costs no more CPU than the plain-text one it replaces (bench/bench_auth.py).
    """
    fields = [ApiToken._meta.get_field(name) for name in TOKEN_FIELDS] + list(get_user_model()._meta.concrete_fields)
    return sql.read_converters(connection, fields)


def _converted(row: tuple) -> list:
    return sql.converted(connection, _converters(), row)


@cache
def _user_attnames() -> tuple[str, ...]:
    return tuple(field.attname for field in get_user_model()._meta.concrete_fields)


@cache
def _cached_attnames() -> tuple[str, ...]:
    """Return the user fields kept in the cache: all but the password hash, which stays in the database only.

    A cached user has its password deferred: reading it costs a query, and saving the user leaves it as it is.
    """
    return tuple(field.attname for field in get_user_model()._meta.concrete_fields if field.attname != "password")


class AuthenticatedToken(NamedTuple):
    """What a request's token look-up yields (DRF's request.auth): a tuple, cheaper to make than a model instance."""

    id: int
    user: object
    expires_at: datetime | None

    def is_expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()


def token_cache_key(digest: str) -> str:
    """Return the cache key of a token's row: its digest, which the database holds too, so never a usable key."""
    return "auth-token:" + digest


def _cached_entry(digest: str) -> tuple | None:
    try:
        return cache_get(caches["default"], token_cache_key(digest))
    except RedisError as exc:
        cache_down.failed(exc)
        return None


def _read(key: str, digest: str) -> tuple | None:
    """Return (user, token id, expiry) for `key` from the database, or None when no token has that digest."""
    with connection.cursor() as cursor:
        cursor.execute(_user_by_token_sql(), key_prefixes(key))
        rows = cursor.fetchall()
    for row in rows:
        if digests_equal(row[0], digest):
            _, token_id, expires_at, *user_values = _converted(row)
            user = get_user_model().from_db(connection.alias, _user_attnames(), user_values)
            return user, token_id, expires_at
    return None


def _from_entry(entry: tuple) -> AuthenticatedToken:
    row, token_id, expires_at = entry
    return AuthenticatedToken(token_id, get_user_model().from_db(connection.alias, _cached_attnames(), row), expires_at)


def token_by_key(key: str) -> AuthenticatedToken | None:
    """Return the API token whose key is `key`, its user loaded (active or not; expired or not), or None."""
    return _token_by_digest(key, key_digest(key))


def _token_by_digest(key: str, digest: str, *, cache_read: bool = True) -> AuthenticatedToken | None:
    lifetime = settings.API_TOKEN_CACHE_SECONDS
    entry = _cached_entry(digest) if lifetime and cache_read else None
    if entry is not None:
        token = _from_entry(entry)
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
        token = AuthenticatedToken(token_id, user, expires_at)
    if len(_token_users) >= TOKEN_USERS_KEPT:
        _token_users.clear()
    _token_users[digest] = token.user.pk
    return token


class CountedToken(NamedTuple):
    """A token look-up that also counted the request under its user's rate limit, or did not (count None)."""

    token: AuthenticatedToken | None
    count: int | None
    count_key: str | None


def token_by_key_counted(key: str, throttle: SharedCacheUserRateThrottle) -> CountedToken:
    """Return token_by_key(key) and, when this process knows the token's user and its row is cached, the request
    counted under that user's window of `throttle`, in the same round trip; otherwise nothing is counted (count None)
    and the caller asks the throttle itself.

    Counted, the request is the token's user's: the cached row names the user, and a row naming another (a token moved
    to another user) takes the count back and is answered as not counted.
    """
    digest = key_digest(key)
    user_id = _token_users.get(digest)
    count_key = throttle.user_window_key(user_id) if user_id is not None else None
    if count_key is not None and settings.API_TOKEN_CACHE_SECONDS:
        try:
            found = cached_then_count(caches["default"], token_cache_key(digest), count_key, ttl=throttle.window_ttl)
        except RedisError as exc:
            cache_down.failed(exc)
            found = None
        if found is not None:
            entry, count = found
            token = _from_entry(entry)
            if token.user.pk == user_id:
                return CountedToken(token, count, count_key)
            throttle.uncount(count_key)
            _token_users[digest] = token.user.pk
            return CountedToken(token, None, None)
        # Not cached (or the cache is down): the database has it, asked once.
        return CountedToken(_token_by_digest(key, digest, cache_read=False), None, None)
    return CountedToken(_token_by_digest(key, digest), None, None)


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
        return self._accepted(token_by_key(key))

    def authenticate_credentials_counted(self, key: str, throttle: SharedCacheUserRateThrottle):
        """Return (user, token, count) as authenticate_credentials returns (user, token), with the request counted by
        `throttle` where token_by_key_counted could (count None where not). A refused token's request is not counted:
        DRF refuses it before any throttle runs.
        """
        counted = token_by_key_counted(key, throttle)
        try:
            user, token = self._accepted(counted.token)
        except exceptions.AuthenticationFailed:
            if counted.count_key is not None:
                throttle.uncount(counted.count_key)
            raise
        return user, token, counted.count

    def _accepted(self, token: AuthenticatedToken | None):
        if token is None:
            raise exceptions.AuthenticationFailed(_("Invalid token."))
        if token.is_expired():
            raise exceptions.AuthenticationFailed(_("Token expired."))
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed(_("User inactive or deleted."))
        return token.user, token
