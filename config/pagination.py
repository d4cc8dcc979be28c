"""Limit/offset pagination that refuses a malformed limit or offset with 400, as the OpenAPI document says."""

from drf_spectacular.utils import OpenApiParameter
from rest_framework import serializers
from rest_framework.pagination import LimitOffsetPagination

MAX_LIMIT = 1000
# Past this MariaDB's OFFSET stops being a sensible request; it is far beyond any user's row count.
MAX_OFFSET = 2**31 - 1


class StrictLimitOffsetPagination(LimitOffsetPagination):
    """DRF's limit/offset pagination, except that a bad value is an error instead of silently the default."""

    max_limit = MAX_LIMIT

    def get_limit(self, request) -> int:
        return self._read(request, self.limit_query_param, minimum=1, maximum=MAX_LIMIT, default=self.default_limit)

    def get_offset(self, request) -> int:
        return self._read(request, self.offset_query_param, minimum=0, maximum=MAX_OFFSET, default=0)

    @staticmethod
    def _read(request, name: str, *, minimum: int, maximum: int, default: int) -> int:
        values = request.query_params.getlist(name)
        if not values:
            return default
        if len(values) > 1 or not values[0].isascii() or not values[0].isdigit():
            raise serializers.ValidationError({name: ["Must be one whole number."]})
        value = int(values[0])
        if not minimum <= value <= maximum:
            raise serializers.ValidationError({name: [f"Must be between {minimum} and {maximum}."]})
        return value


def page_parameters(noun: str) -> list[OpenApiParameter]:
    """Return the documented limit and offset query parameters for a list of `noun`."""
    return [
        OpenApiParameter(
            "limit",
            {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT},
            description=f"{noun.capitalize()} per page (default 50, at most {MAX_LIMIT}).",
        ),
        OpenApiParameter(
            "offset",
            {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET},
            description=f"{noun.capitalize()} to skip, newest first.",
        ),
    ]
