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
