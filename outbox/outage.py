"""Living through an outage of the broker or the database: log it once, then now and then, and back off."""

import logging
import time

from core.backoff import backoff_delay

logger = logging.getLogger(__name__)


class OutageLog:
    """Log an outage once when it starts, then every `every` seconds while it lasts, and once when it ends."""

    def __init__(self, what: str, *, every: float = 60.0, log: logging.Logger = logger):
        self.what = what
        self.every = every
        self.log = log
        self.since: float | None = None
        self._last_warning = 0.0

    def failed(self, exc: BaseException) -> None:
        now = time.monotonic()
        if self.since is None:
            self.since = self._last_warning = now
            self.log.warning("%s unreachable, backing off: %s", self.what, exc)
        elif now - self._last_warning >= self.every:
            self._last_warning = now
            self.log.warning("%s still unreachable after %.0f s: %s", self.what, now - self.since, exc)

    def recovered(self) -> None:
        if self.since is not None:
            self.log.warning("%s reachable again after %.0f s", self.what, time.monotonic() - self.since)
            self.since = None


def outage_backoff(failures: int, *, cap: float = 30.0) -> float:
    """Return how long to wait after `failures` consecutive failed attempts to reach the broker or database."""
    return backoff_delay(failures - 1, base=0.5, cap=cap)
