"""Failing fast while a dependency is known silent: a circuit breaker with one probe at a time.

A dependency that stops answering costs each caller its whole deadline. Once one caller has paid it, the others
need not: for `cooldown` seconds every call is refused at once, then one caller at a time probes the dependency
(paying the deadline again if it is still silent) while the others keep being refused; the first call that gets an
answer closes the breaker. pybreaker, the well-kept library for this, holds one lock across every call it guards,
which would serialize a web process's threads on their database connects and Redis commands; this one takes no lock
while closed, the state of nearly every call.
"""

import threading
import time


class Breaker:
    """One dependency's breaker, shared by every thread of a process."""

    def __init__(self, name: str, *, cooldown: float):
        self.name = name
        self.cooldown = cooldown
        # Monotonic time until which calls are refused; 0.0 while closed (read without the lock).
        self._open_until = 0.0
        self._probing = False
        self._lock = threading.Lock()

    @property
    def closed(self) -> bool:
        return not self._open_until

    def allow(self) -> bool:
        """Return whether a call may go to the dependency now; a True while open makes the caller the one probe.

        The caller then reports how it went with succeeded() or failed(), whatever happens.
        """
        if not self._open_until:
            return True
        with self._lock:
            if self._probing or time.monotonic() < self._open_until:
                return False
            self._probing = True
            return True

    def succeeded(self) -> None:
        """The dependency answered: close the breaker."""
        if self._open_until or self._probing:
            with self._lock:
                self._open_until = 0.0
                self._probing = False

    def failed(self) -> None:
        """The dependency did not answer in time, or refused: refuse calls for the cooldown, then probe again."""
        with self._lock:
            self._open_until = time.monotonic() + self.cooldown
            self._probing = False

    def reset(self) -> None:
        """Close the breaker (tests, and a process that forked)."""
        self.succeeded()
