"""Rate limits counted in the shared cache (Redis): exact across processes, and open when the cache is down."""

import logging
import math
import threading
import time

from redis.exceptions import RedisError
from rest_framework.throttling import UserRateThrottle

logger = logging.getLogger(__name__)

# While the cache is down every throttled request would warn; one warning per process this often is enough to see.
CACHE_DOWN_WARNING_SECONDS = 60.0
_warning_lock = threading.Lock()
_last_warning_at = -math.inf


def _warn_cache_down(exc: Exception) -> None:
    global _last_warning_at
    with _warning_lock:
        now = time.monotonic()
        if now - _last_warning_at < CACHE_DOWN_WARNING_SECONDS:
            return
        _last_warning_at = now
    logger.warning("rate limits are off: the shared cache does not answer (%s); requests are let through", exc)


class SharedCacheUserRateThrottle(UserRateThrottle):
    """Per-user fixed-window counter in the shared cache: at most N requests per window, whichever process serves.

    DRF's own throttle reads a list of timestamps and writes it back, so concurrent requests in different workers
    overwrite each other's entries and all pass. ADD and INCR are each one atomic Redis command, so the (N+1)th
    request of a window is refused whatever the concurrency. Windows are aligned to the clock: a burst across a
    window boundary may get N on each side.

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
            # The count outlives its window a little, so INCR never finds it expired between the two commands.
            self.cache.add(key, 0, timeout=self.duration + 1)
            count = self.cache.incr(key)
        except RedisError as exc:
            _warn_cache_down(exc)
            return True
        return count <= self.num_requests

    def wait(self) -> float:
        """Return the seconds until the current window ends, at least one (DRF sends no Retry-After for zero)."""
        return max(self.window_ends_at - self.timer(), 1.0)
