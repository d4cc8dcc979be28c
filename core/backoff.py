"""Capped exponential backoff with equal jitter: the one delay schedule every retry loop of the project uses."""

import random

# 2.0 ** 1024 overflows a float; long before that exponent the cap applies, whatever the base.
_MAX_EXPONENT = 1023


def backoff_delay(attempt: int, *, base: float, cap: float, jitter: bool = True) -> float:
    """Return the seconds to wait before try number `attempt` (0-based): base * 2**attempt, capped at `cap`.

    With jitter ("equal jitter"), half of that ceiling is fixed and half is random, so delays still grow from one
    try to the next while callers that failed together do not retry together.
    """
    if attempt < 0:
        raise ValueError(f"attempt must be 0 or more, not {attempt}")
    ceiling = min(cap, base * 2.0 ** min(attempt, _MAX_EXPONENT))
    if not jitter:
        return ceiling
    return ceiling / 2 + random.uniform(0, ceiling / 2)
