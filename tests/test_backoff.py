"""core.backoff: the delay doubles from the base, stops at the cap, and the jitter stays within its half."""

import random

import pytest

from core.backoff import backoff_delay


def test_without_jitter_the_delay_doubles_from_the_base_up_to_the_cap():
    delays = [backoff_delay(n, base=0.5, cap=30.0, jitter=False) for n in range(10)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0, 30.0]


def test_with_jitter_each_delay_lies_in_the_upper_half_of_its_ceiling():
    for n in range(12):
        ceiling = min(60.0, 1.0 * 2**n)
        delays = [backoff_delay(n, base=1.0, cap=60.0) for _ in range(200)]
        assert all(ceiling / 2 <= delay <= ceiling for delay in delays)
        # The random half spreads callers that failed together.
        assert max(delays) - min(delays) > ceiling / 10


def test_jittered_delays_never_shrink_from_one_attempt_to_the_next():
    # The fixed half of attempt n+1 is the whole ceiling of attempt n: growth survives the jitter, up to the cap.
    previous = [0.0]
    for n in range(7):  # ceilings 1 to 64; the next would be cut to the cap of 100
        delays = [backoff_delay(n, base=1.0, cap=100.0) for _ in range(100)]
        assert min(delays) >= max(previous)
        previous = delays


def test_equal_jitter_is_half_fixed_half_uniform():
    rng_state = random.getstate()
    try:
        random.seed(7)
        delays = [backoff_delay(3, base=1.0, cap=100.0) for _ in range(3)]
        random.seed(7)
        expected = [4.0 + random.uniform(0, 4.0) for _ in range(3)]
    finally:
        random.setstate(rng_state)
    assert delays == expected


@pytest.mark.parametrize("attempt", [64, 1023, 1024, 10_000, 10**9])
def test_a_huge_attempt_number_gives_the_cap_without_overflowing(attempt):
    assert backoff_delay(attempt, base=0.01, cap=600.0, jitter=False) == 600.0
    assert 300.0 <= backoff_delay(attempt, base=2.0, cap=600.0) <= 600.0


def test_a_negative_attempt_is_refused():
    with pytest.raises(ValueError):
        backoff_delay(-1, base=1.0, cap=10.0)
