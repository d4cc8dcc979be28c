"""Rate limits counted in the shared cache (Redis): exact across processes, and open when the cache is down."""

import logging

from redis.exceptions import RedisError
from rest_framework.throttling import UserRateThrottle

from core.cache import CacheDownLog

logger = logging.getLogger(__name__)
cache_down = CacheDownLog(
    logger, "rate limits are off: the shared cache does not answer (%s); requests are let through"
)


def window_count_incr(cache, key: str, *, ttl: int) -> int:
    """Count one more request under `key` in Django's Redis `cache` and return the count, in one round trip.

    EXPIRE is sent with every INCR (no MULTI needed: INCR alone decides the count), so the key lives `ttl` seconds
    past its last request and a window's count never outlives the window by much.
    """
    key = cache.make_and_validate_key(key)
    pipeline = cache._cache.get_client(key, write=True).pipeline(transaction=False)
    count, _ = pipeline.incr(key).expire(key, ttl).execute()
    return count


class SharedCacheUserRateThrottle(UserRateThrottle):
    """Per-user fixed-window counter in the shared cache: at most N requests per window, whichever process serves.

    DRF's own throttle reads a list of timestamps and writes it back, so concurrent requests in different workers
    overwrite each other's entries and all pass. INCR is one atomic Redis command, so the (N+1)th request of a
    window is refused whatever the concurrency. INCR and the EXPIRE that bounds the count's life go out pipelined:
    one round trip per request (ADD then INCR, as before, cost two). Windows are aligned to the clock: a burst across
    a window boundary may get N on each side.

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
