"""Waiting in tests and benchmarks for a condition rather than for a time, with deadlines meant for a loaded machine.

A wait returns as soon as its condition holds, so a generous deadline costs nothing when all is well: it only says
how long a broken run takes to fail. Tests share two cores with other runs, the suite's own Spark JVM and the
processes they start; a deadline is a bound far above what a step takes idle, never an estimate of it. Wait for the
state a test needs (a count in a database, a publish held at a proxy), not for a log line written on the way to it:
a client stuck in that state writes nothing more.
"""

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

# A step that takes a second or two on an idle machine; a wait for something slower passes its own deadline.
DEADLINE_SECONDS = 60.0


def wait_for(
    predicate: Callable[[], T],
    *,
    what: str,
    timeout: float = DEADLINE_SECONDS,
    interval: float = 0.1,
    details: Callable[[], str] | None = None,
) -> T:
    """Return the predicate's first true value; past the deadline, fail naming `what`, with `details()` as of then."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f}s waiting for {what}" + (f"\n{details()}" if details else "")
            )
        time.sleep(interval)
    return value


def log_count(path: Path, text: str) -> int:
    """Return how often `text` occurs in a log file, 0 while the file does not exist yet."""
    return path.read_text(errors="replace").count(text) if path.exists() else 0
