"""The key ranges the look-ups and the fetch read by: every candidate covered, at most so many ranges per kind."""

import pytest

from analytics.lookups import candidate_ranges

pytestmark = pytest.mark.spark


def candidates(spark, rows):
    return spark.createDataFrame(rows, "kind string, id long")


def test_few_candidates_are_one_range_each_however_often_they_are_named(spark):
    named = [("order", 7), ("order", 3), ("order", 7), ("credit", 40), ("credit", 41)]

    assert candidate_ranges(candidates(spark, named), max_ranges=2) == {
        "order": [(3, 3), (7, 7)],
        "credit": [(40, 40), (41, 41)],
    }
    assert candidate_ranges(candidates(spark, [])) == {}


def test_a_kind_with_more_candidates_than_ranges_gets_slices_that_cover_each(spark):
    orders = [("order", i) for i in (1, 2, 5, 9, 10, 30, 31, 100)]
    named = [*orders, ("log", 12), ("log", 13)]

    ranges = candidate_ranges(candidates(spark, named), max_ranges=3)

    # The crowded kind: at most 3 slices of its span, each narrowed to the ids in it; the other kind keeps its ids.
    assert ranges["log"] == [(12, 12), (13, 13)]
    assert len(ranges["order"]) <= 3
    assert all(any(low <= i <= high for low, high in ranges["order"]) for _, i in orders)
    assert ranges["order"] == sorted(ranges["order"]) and ranges["order"][0][0] == 1 and ranges["order"][-1][1] == 100
