"""The shared cache (Redis) on the request path: a cache-down warning logged once a minute, not once per request."""

import logging
import math
import threading
import time

# While the cache is down every request would warn; one warning per process this often is enough to see.
CACHE_DOWN_WARNING_SECONDS = 60.0


class CacheDownLog:
    """Logs `message` (with the error) at most once every CACHE_DOWN_WARNING_SECONDS per process; thread-safe."""

    def __init__(self, logger: logging.Logger, message: str):
        self.logger = logger
        self.message = message
        self.last_warning_at = -math.inf
        self._lock = threading.Lock()

    def failed(self, exc: Exception) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self.last_warning_at < CACHE_DOWN_WARNING_SECONDS:
                return
            self.last_warning_at = now
        self.logger.warning(self.message, exc)


def cache_get(cache, key: str):
    """Return `cache.get(key)` (None when missing) through one redis-py client kept per cache backend.

    Django's RedisCache builds a new redis-py client for every command, which copies the client's ~170 response
    callbacks: under cProfile that was 0.43 of the 2.0 ms per cached API token look-up (1,000 look-ups,
    bench/bench_auth.py). The client shares the backend's connection pool, so nothing else changes; a race builds
    two and keeps one.
    """
    backend = cache._cache
    client = backend.__dict__.get("_shared_read_client")
    if client is None:
        client = backend.__dict__["_shared_read_client"] = backend.get_client()
    value = client.get(cache.make_and_validate_key(key))
    return None if value is None else backend._serializer.loads(value)
