"""Rate limits counted in the shared cache (Redis): exact across processes, and open when the cache is down."""

import logging
from typing import Any

from redis.commands.core import Script
from redis.exceptions import RedisError
from rest_framework.throttling import UserRateThrottle

from core.cache import CacheDownLog, shared_client

logger = logging.getLogger(__name__)
cache_down = CacheDownLog(
    logger, "rate limits are off: the shared cache does not answer (%s); requests are let through"
)


# INCR, and on a window's first request EXPIRE, as one script: one round trip and one command per request. A redis-py
# pipeline would do the same in one round trip, but building one copies the client's response callbacks, on every
# request (bench_orders.py --profile shows it); so does building a client, hence the shared one
# (core/cache.shared_client).
WINDOW_COUNT_INCR = Script(
    None, b"local n = redis.call('INCR', KEYS[1]) if n == 1 then redis.call('EXPIRE', KEYS[1], ARGV[1]) end return n"
)


# GET one key and, only when it holds a value, count one more request under a second key as WINDOW_COUNT_INCR does:
# one round trip for a request that needs a cached value and a count, the value deciding whether there is a request to
# count (the order's cached API token, then its user's rate limit: accounts/authentication.token_by_key_counted).
CACHED_THEN_COUNT = Script(
    None,
    b"local v = redis.call('GET', KEYS[1]) if not v then return nil end"
    b" local n = redis.call('INCR', KEYS[2]) if n == 1 then redis.call('EXPIRE', KEYS[2], ARGV[1]) end"
    b" return {v, n}",
)

# DECR only while the count lives: a count that expired meanwhile has nothing to take back, and a DECR would leave -1
# under its key with no expiry.
WINDOW_COUNT_DECR = Script(None, b"if redis.call('EXISTS', KEYS[1]) == 1 then return redis.call('DECR', KEYS[1]) end")


def window_count_incr(cache, key: str, *, ttl: int) -> int:
    """Count one more request under `key` in Django's Redis `cache` and return the count, in one round trip.

    The count expires `ttl` seconds after the window's first request, so it never outlives its window by much.
    """
    key = cache.make_and_validate_key(key)
    return WINDOW_COUNT_INCR(keys=[key], args=[ttl], client=shared_client(cache, write=True))


def cached_then_count(cache, key: str, count_key: str, *, ttl: int) -> tuple[Any, int] | None:
    """Return `cache.get(key)` and the count under `count_key` after one more, in one round trip, when `key` holds a
    value; None, with nothing counted, when it does not. The count expires as window_count_incr's does.
    """
    keys = [cache.make_and_validate_key(key), cache.make_and_validate_key(count_key)]
    reply = CACHED_THEN_COUNT(keys=keys, args=[ttl], client=shared_client(cache, write=True))
    if reply is None:
        return None
    value, count = reply
    return cache._cache._serializer.loads(value), count


class SharedCacheUserRateThrottle(UserRateThrottle):
    """Per-user fixed-window counter in the shared cache: at most N requests per window, whichever process serves.

    DRF's own throttle reads a list of timestamps and writes it back, so concurrent requests in different workers
    overwrite each other's entries and all pass. INCR is one atomic Redis command, so the (N+1)th request of a
    window is refused whatever the concurrency. INCR and the EXPIRE that bounds the count's life run as one Lua
    script: one round trip per request (ADD then INCR, as before, cost two). Windows are aligned to the clock: a
    burst across a window boundary may get N on each side.

    When the cache does not answer the throttle lets the request through (fails open) and logs a warning at most
    once a minute: a rate limit protects the service, and refusing every order because Redis is down would not.
    """

    def allow_request(self, request, view) -> bool:
        if self.rate is None:
            return True
        key = self.get_cache_key(request, view)
        if key is None:
            return True
        key = self._in_window(key)
        try:
            count = window_count_incr(self.cache, key, ttl=self.window_ttl)
        except RedisError as exc:
            cache_down.failed(exc)
            return True
        return self.allows(count)

    def user_window_key(self, user_id) -> str | None:
        """Return the key counting the current window's requests of the user with this primary key (None: no limit),
        as allow_request counts an authenticated user's; for a caller that counts with another command (the order's
        token look-up), then asks allows() and, for a request it must not count after all, uncounts."""
        if self.rate is None:
            return None
        return self._in_window(self.cache_format % {"scope": self.scope, "ident": user_id})

    @property
    def window_ttl(self) -> int:
        """Seconds a window's count lives: a second past the window, so it never outlives it by much."""
        return int(self.duration) + 1

    def allows(self, count: int) -> bool:
        """Return whether a request that brought its window's count to `count` is let through."""
        return count <= self.num_requests

    def uncount(self, key: str) -> None:
        """Take back one request counted under `key` (a request refused before the throttle would have counted it)."""
        try:
            key = self.cache.make_and_validate_key(key)
            WINDOW_COUNT_DECR(keys=[key], client=shared_client(self.cache, write=True))
        except RedisError as exc:
            cache_down.failed(exc)

    def _in_window(self, key: str) -> str:
        window = int(self.timer() // self.duration)
        self.window_ends_at = (window + 1) * self.duration
        return f"{key}:{window}"

    def wait(self) -> float:
        """Return the seconds until the current window ends, at least one (DRF sends no Retry-After for zero)."""
        return max(self.window_ends_at - self.timer(), 1.0)
