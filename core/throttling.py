"""Rate limits counted in the shared cache (Redis): exact across processes, and open when the cache is down."""

import logging

from redis.commands.core import Script
from redis.exceptions import RedisError
from rest_framework.throttling import UserRateThrottle

from core.cache import CacheDownLog, shared_client

logger = logging.getLogger(__name__)
cache_down = CacheDownLog(
    logger, "rate limits are off: the shared cache does not answer (%s); requests are let through"
)


# INCR, and on a window's first request EXPIRE, as one script: one round trip and one command per request. A redis-py
# pipeline would do the same in one round trip, but building one copies the client's ~170 response callbacks: 0.1 ms
# of a web worker's CPU per request (cProfile, bench_orders.py --profile); so does building a client, hence the
# shared one (core/cache.shared_client).
WINDOW_COUNT_INCR = Script(
    None, b"local n = redis.call('INCR', KEYS[1]) if n == 1 then redis.call('EXPIRE', KEYS[1], ARGV[1]) end return n"
)


def window_count_incr(cache, key: str, *, ttl: int) -> int:
    """Count one more request under `key` in Django's Redis `cache` and return the count, in one round trip.

    The count expires `ttl` seconds after the window's first request, so it never outlives its window by much.
    """
    key = cache.make_and_validate_key(key)
    return WINDOW_COUNT_INCR(keys=[key], args=[ttl], client=shared_client(cache, write=True))


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
        window = int(self.timer() // self.duration)
        self.window_ends_at = (window + 1) * self.duration
        key = f"{key}:{window}"
        try:
            count = window_count_incr(self.cache, key, ttl=int(self.duration) + 1)
        except RedisError as exc:
            cache_down.failed(exc)
            return True
        return count <= self.num_requests

    def wait(self) -> float:
        """Return the seconds until the current window ends, at least one (DRF sends no Retry-After for zero)."""
        return max(self.window_ends_at - self.timer(), 1.0)
