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


def shared_client(cache, *, write: bool = False):
    """Return the redis-py client kept per Django Redis cache backend, for reads or for writes.

    Django's RedisCache builds a new redis-py client for every command, which copies the client's ~170 response
    callbacks: under cProfile that was 0.43 of the 2.0 ms per cached API token look-up (1,000 look-ups,
    bench/bench_auth.py), and 9% of a loaded gunicorn worker's CPU per order for the throttle's script (bench_orders.py,
    2026-11-25). The client shares the backend's connection pool (the same one get_client picks), so nothing else
    changes; it is thread-safe, as the pool is; a race builds two and keeps one.
    """
    backend = cache._cache
    attribute = "_shared_write_client" if write else "_shared_read_client"
    client = backend.__dict__.get(attribute)
    if client is None:
        client = backend.__dict__[attribute] = backend.get_client(write=write)
    return client


def cache_get(cache, key: str):
    """Return `cache.get(key)` (None when missing) through the backend's shared client (shared_client)."""
    value = shared_client(cache).get(cache.make_and_validate_key(key))
    return None if value is None else cache._cache._serializer.loads(value)
