import pytest

from credits.errors import MalformedMessage, UnsupportedSchemaVersion
from credits.messages import AwardMessage, award_message_parse

TX = "0123456789abcdef0123456789abcdef"
VALID = {"schema_version": 1, "transaction_id": TX, "order_id": 7, "user_id": 3, "total": 5}


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


@pytest.mark.parametrize("version", [0, 2, 99])
def test_unknown_schema_versions_are_refused(version):
    with pytest.raises(UnsupportedSchemaVersion):
        award_message_parse({**VALID, "schema_version": version})


def test_error_texts_stay_short_for_huge_values():
    with pytest.raises(MalformedMessage) as info:
        award_message_parse({**VALID, "transaction_id": "x" * 100_000})
    assert len(info.value.message) < 200
