"""The strict fields refuse what DRF would coerce; the written-out Unicode table agrees with unicodedata."""

import re
import unicodedata

import pytest
from rest_framework import serializers

from core.fields import PRINTABLE_TEXT_PATTERN, UNPRINTABLE_BMP, StrictCharField, StrictIntegerField, refuse_unprintable


def test_the_unprintable_character_class_matches_unicodedata():
    pattern = re.compile(f"[{UNPRINTABLE_BMP}]")
    written = {code for code in range(0x10000) if pattern.match(chr(code))}
    categorised = {code for code in range(0x10000) if unicodedata.category(chr(code)) in ("Cc", "Cf")}
    assert written == categorised


@pytest.mark.parametrize("value", ["3", 3.0, True, [3]])
def test_the_strict_integer_field_refuses_what_is_not_a_json_integer(value):
    with pytest.raises(serializers.ValidationError, match="A JSON integer is required"):
        StrictIntegerField().run_validation(value)
    assert StrictIntegerField().run_validation(3) == 3


@pytest.mark.parametrize("value", [3, 3.5, True, ["tea"], {"tea": 1}])
def test_the_strict_char_field_refuses_what_is_not_a_json_string(value):
    with pytest.raises(serializers.ValidationError, match="A JSON string is required"):
        StrictCharField().run_validation(value)
    assert StrictCharField().run_validation(" tea ") == "tea"


@pytest.mark.parametrize("text", ["tea", " green tea ", "caf\u00e9"])
def test_printable_text_passes_both_checks(text):
    assert re.fullmatch(PRINTABLE_TEXT_PATTERN, text)
    refuse_unprintable(text)


@pytest.mark.parametrize("text", ["a\u202eb", "zero\u200bwidth", "tab\there", "   "])
def test_the_pattern_refuses_invisible_text_of_the_bmp(text):
    assert not re.fullmatch(PRINTABLE_TEXT_PATTERN, text)


@pytest.mark.parametrize("text", ["a\u202eb", "\U000e0001tag", "\ud800"])
def test_refuse_unprintable_sees_every_plane(text):
    with pytest.raises(serializers.ValidationError, match="Control and format characters"):
        refuse_unprintable(text)
