import pytest

from core.contract import CREATED_AT_HEADER
from credits.headers import message_created_at


class _Request:
    headers = None


@pytest.mark.parametrize(("value", "expected"), [(1700000000.5, 1700000000.5), (1700000000, 1700000000.0)])
def test_the_message_creation_time_is_read_from_the_relays_header(value, expected):
    request = _Request()
    setattr(request, CREATED_AT_HEADER, value)

    assert message_created_at(request) == expected


def test_a_retry_may_carry_it_nested_under_headers():
    request = _Request()
    request.headers = {CREATED_AT_HEADER: 1700000000.25}

    assert message_created_at(request) == 1700000000.25


@pytest.mark.parametrize("value", [None, "1700000000", True])
def test_a_missing_or_malformed_creation_time_is_unknown(value):
    request = _Request()
    setattr(request, CREATED_AT_HEADER, value)

    assert message_created_at(request) is None
