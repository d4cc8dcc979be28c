"""The REST API's JSON parser: standard JSON only, and a 400 (never a 500) for bodies built to hurt the parser."""

import codecs
import json
import math

from rest_framework import parsers
from rest_framework.exceptions import ParseError

# No request of this API nests deeper than 2; 32 leaves room and keeps every later walk of the data shallow.
MAX_JSON_DEPTH = 32


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    # Parsers disagree on which duplicate wins (the first, the last, an error), so a body with one could mean one
    # thing to a proxy or signature check and another to us: refuse it.
    data = dict(pairs)
    if len(data) != len(pairs):
        seen: set[str] = set()
        duplicate = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise ValueError(f"duplicate key {duplicate[:40]!r}")
    return data


def json_depth(data: object) -> int:
    """Return how deeply lists and objects nest in parsed JSON (a scalar is 0), without recursion."""
    deepest, stack = 0, [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            value = list(value.values())
        if isinstance(value, list):
            deepest = max(deepest, depth + 1)
            if deepest > MAX_JSON_DEPTH:
                return deepest
            stack.extend((item, depth + 1) for item in value)
    return deepest


def strict_loads(text: str) -> object:
    """Parse JSON `text` as JSONParser does; raise ParseError (a 400) for anything it refuses."""
    try:
        data = json.loads(
            text, parse_constant=_reject_constant, parse_float=_finite_float, object_pairs_hook=_unique_keys
        )
    except RecursionError:
        raise ParseError(f"JSON parse error - nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:
        raise ParseError(f"JSON parse error - {str(exc)[:200]}") from None
    if json_depth(data) > MAX_JSON_DEPTH:
        raise ParseError(f"JSON parse error - nested deeper than {MAX_JSON_DEPTH} levels")
    return data


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser, refusing with 400: duplicate keys, numbers out of float range, NaN and Infinity,
    nesting deeper than MAX_JSON_DEPTH (the standard decoder recurses, and a deep enough body overflows it)."""

    def parse(self, stream, media_type=None, parser_context=None):
        encoding = parsers.get_encoding(parser_context or {})
        try:
            text = codecs.getreader(encoding)(stream).read()
        except ValueError as exc:  # UnicodeDecodeError
            raise ParseError(f"JSON parse error - {str(exc)[:200]}") from None
        return strict_loads(text)
