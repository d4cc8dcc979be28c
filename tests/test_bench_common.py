"""bench/common.py: what the benchmarks share."""

from bench.common import ratio


def test_a_ratio_over_nothing_measured_says_so_instead_of_failing_the_run():
    assert ratio(0.87, 1.0) == "0.87x"
    assert ratio(0.5, 0.0) == "n/a (none measured)"
    assert ratio(0.0, 0.0) == "n/a (none measured)"
