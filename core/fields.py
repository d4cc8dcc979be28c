"""The REST API's strict serializer fields and text rules: after the JSON parser (core/parsers.py), what a field takes.

JSON already says what type a value is, so a field refuses what DRF would otherwise coerce ("3" as 3, true as 1), and
text refuses the invisible characters that make one string look like another in a list or a log.
"""

import unicodedata

from rest_framework import serializers


class StrictIntegerField(serializers.IntegerField):
    """An integer field that refuses strings, floats and booleans instead of coercing them."""

    default_error_messages = {"invalid": "A JSON integer is required."}

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictCharField(serializers.CharField):
    """A text field that refuses numbers and other non-strings instead of converting them."""

    default_error_messages = {"invalid": "A JSON string is required."}

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


# Unicode's control (Cc) and format (Cf: bidi overrides, zero-width) characters of the Basic Multilingual Plane as
# of Unicode 14 (Python 3.11), written out because scanning unicodedata takes a second (tests/test_fields.py checks
# the two agree). The OpenAPI document carries them as a pattern, so generated data and clients know the rule; JSON
# Schema patterns cannot name characters beyond the BMP, so refuse_unprintable checks the rest by category.
UNPRINTABLE_BMP_RANGES = (
    (0x0000, 0x001F), (0x007F, 0x009F), (0x00AD, 0x00AD), (0x0600, 0x0605), (0x061C, 0x061C), (0x06DD, 0x06DD),
    (0x070F, 0x070F), (0x0890, 0x0891), (0x08E2, 0x08E2), (0x180E, 0x180E), (0x200B, 0x200F), (0x202A, 0x202E),
    (0x2060, 0x2064), (0x2066, 0x206F), (0xFEFF, 0xFEFF), (0xFFF9, 0xFFFB),
)  # fmt: skip
UNPRINTABLE_BMP = "".join(
    rf"\u{first:04x}" + ("" if first == last else rf"-\u{last:04x}") for first, last in UNPRINTABLE_BMP_RANGES
)
# Text with at least one visible character and none of the above. Surrounding whitespace is trimmed before
# validation, so the pattern allows it there, and asks for one visible character, as the blank check does.
PRINTABLE_TEXT_PATTERN = rf"^\s*[^{UNPRINTABLE_BMP}\s](?:[^{UNPRINTABLE_BMP}]*[^{UNPRINTABLE_BMP}\s])?\s*$"
UNPRINTABLE_MESSAGE = "Control and format characters are not allowed."


def refuse_unprintable(value: str) -> None:
    """Refuse control, format and surrogate characters anywhere in Unicode (the pattern covers the BMP only)."""
    if any(unicodedata.category(ch) in ("Cc", "Cf", "Cs") for ch in value):
        raise serializers.ValidationError(UNPRINTABLE_MESSAGE)
