"""The shared cache (Redis) on the request path: a cache-down warning logged once a minute, not once per request, and
no request waiting on a cache already found silent.

Every Redis command of a process goes through `FailFastConnection` (the cache's pool_class, config/settings.py):
once one command found Redis silent (its 1 s socket timeout passed) or unreachable, the others are refused at once for
CACHE_FAIL_FAST_SECONDS, then one at a time probes it (core/breaker.py). Every caller already treats a RedisError as
the cache being down (the throttle lets the request through, the token is read from the database, a wake-up is sent
as a task), so a silent Redis costs one request in a few seconds its timeout instead of every request.
"""

import logging
import math
import threading
import time

from redis.connection import Connection, ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from core.breaker import Breaker

# While the cache is down every request would warn; one warning per process this often is enough to see.
CACHE_DOWN_WARNING_SECONDS = 60.0
# How long a process refuses Redis commands at once after one got no answer in time, before it probes again.
CACHE_FAIL_FAST_SECONDS = 5.0

cache_breaker = Breaker("shared cache", cooldown=CACHE_FAIL_FAST_SECONDS)


class FailFastConnection(Connection):
    """redis-py's connection, refusing commands at once while `cache_breaker` is open and telling it what it found.

    A connection let through as the breaker's probe stays the probe from its connect to the answer it reads.
    """

    _probe = False

    def _gate(self) -> None:
        if cache_breaker.closed or self._probe:
            return
        if not cache_breaker.allow():
            raise RedisConnectionError("the shared cache did not answer just now; not waiting for it again yet")
        self._probe = True

    def _report(self, *, answered: bool) -> None:
        self._probe = False
        if answered:
            cache_breaker.succeeded()
        else:
            cache_breaker.failed()

    def connect(self):
        self._gate()
        try:
            super().connect()
        except (RedisConnectionError, RedisTimeoutError, OSError):
            self._report(answered=False)
            raise

    def send_packed_command(self, command, check_health=True):
        self._gate()
        try:
            super().send_packed_command(command, check_health)
        except (RedisConnectionError, RedisTimeoutError, OSError):
            self._report(answered=False)
            raise

    def read_response(self, *args, **kwargs):
        try:
            response = super().read_response(*args, **kwargs)
        except (RedisConnectionError, RedisTimeoutError, OSError):
            self._report(answered=False)
            raise
        except BaseException:  # an error Redis answered with
            self._report(answered=True)
            raise
        if self._probe or not cache_breaker.closed:
            self._report(answered=True)
        return response


class FailFastConnectionPool(ConnectionPool):
    """redis-py's pool of FailFastConnections (the cache's pool_class; a rediss:// URL keeps its SSL connections)."""

    def __init__(self, connection_class=FailFastConnection, **kwargs):
        super().__init__(connection_class=connection_class, **kwargs)


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
    callbacks: work on every cached API token look-up and every throttle count, both on each order's path
    (bench/bench_auth.py and bench_orders.py measure them). The client shares the backend's connection
    pool (the same one get_client picks), so nothing else changes; it is thread-safe, as the pool is; a race builds
    two and keeps one.
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
