from datetime import UTC, datetime, timedelta

import pytest

from credits.errors import MalformedMessage, NewerSchemaVersion, UnsupportedSchemaVersion
from credits.messages import AwardMessage, award_message_parse

TX = "0123456789abcdef0123456789abcdef"
VALID = {"schema_version": 1, "transaction_id": TX, "order_id": 7, "user_id": 3, "total": 5}
ORDERED_AT = "2026-11-24T23:30:01.250000+00:00"
VALID_2 = {**VALID, "schema_version": 2, "ordered_at": ORDERED_AT}


def test_a_valid_message_parses():
    assert award_message_parse(VALID) == AwardMessage(transaction_id=TX, order_id=7, user_id=3, total=5)


def test_unknown_keys_are_ignored():
    assert award_message_parse({**VALID, "business": "order"}).order_id == 7


@pytest.mark.parametrize(
    "payload",
    [
        None,
        "text",
        [VALID],
        {**VALID, "schema_version": "1"},
        {**VALID, "schema_version": True},
        {k: v for k, v in VALID.items() if k != "schema_version"},
        {**VALID, "transaction_id": TX.upper()},
        {**VALID, "transaction_id": TX[:-1]},
        {**VALID, "transaction_id": 123},
        {**VALID, "order_id": 0},
        {**VALID, "order_id": "7"},
        {**VALID, "order_id": True},
        {**VALID, "user_id": None},
        {**VALID, "user_id": 3.0},
        {**VALID, "total": 0},
        {**VALID, "total": 10_001},
        {**VALID, "total": "ten"},
        {k: v for k, v in VALID.items() if k != "total"},
    ],
)
def test_malformed_messages_are_refused(payload):
    with pytest.raises(MalformedMessage):
        award_message_parse(payload)


def test_a_version_2_message_carries_when_the_order_was_placed():
    assert award_message_parse(VALID_2) == AwardMessage(
        transaction_id=TX, order_id=7, user_id=3, total=5, ordered_at=datetime(2026, 11, 24, 23, 30, 1, 250000, UTC)
    )
    offset = award_message_parse({**VALID_2, "ordered_at": "2026-11-25T01:30:01+02:00"}).ordered_at
    assert offset == datetime(2026, 11, 24, 23, 30, 1, tzinfo=UTC)
    assert offset.utcoffset() == timedelta(hours=2)


def test_a_version_1_message_has_no_order_time_even_if_it_carries_the_field():
    # Version 1 does not define ordered_at: a field the version does not know is ignored, whatever it says.
    assert award_message_parse({**VALID, "ordered_at": ORDERED_AT}).ordered_at is None


@pytest.mark.parametrize(
    "ordered_at", [None, "", "yesterday", "2026-11-24T23:30:01", 1764027001, "2026-11-24T23:30:01+00:00" + " " * 64]
)
def test_a_version_2_message_without_a_zoned_order_time_is_malformed(ordered_at):
    payload = {**VALID_2, "ordered_at": ordered_at} if ordered_at is not None else {**VALID, "schema_version": 2}
    with pytest.raises(MalformedMessage, match="ordered_at"):
        award_message_parse(payload)


@pytest.mark.parametrize("version", [3, 99])
def test_a_version_newer_than_every_accepted_one_is_newer_not_unsupported(version):
    with pytest.raises(NewerSchemaVersion, match=f"schema_version {version} is newer"):
        award_message_parse({**VALID_2, "schema_version": version})


def test_a_consumer_limited_to_version_1_finds_version_2_newer(settings):
    settings.CREDITS_ACCEPTED_MESSAGE_VERSIONS = frozenset({1})
    assert award_message_parse(VALID).order_id == 7
    with pytest.raises(NewerSchemaVersion):
        award_message_parse(VALID_2)


@pytest.mark.parametrize("version", [0, -1])
def test_a_version_older_than_every_accepted_one_is_unsupported(version):
    with pytest.raises(UnsupportedSchemaVersion):
        award_message_parse({**VALID, "schema_version": version})


def test_a_version_no_longer_accepted_is_unsupported(settings):
    settings.CREDITS_ACCEPTED_MESSAGE_VERSIONS = frozenset({2})
    assert award_message_parse(VALID_2).order_id == 7
    with pytest.raises(UnsupportedSchemaVersion, match=r"accepted: \[2\]"):
        award_message_parse(VALID)


def test_error_texts_stay_short_for_huge_values():
    with pytest.raises(MalformedMessage) as info:
        award_message_parse({**VALID, "transaction_id": "x" * 100_000})
    assert len(info.value.message) < 200
