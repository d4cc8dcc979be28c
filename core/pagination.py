"""The one pagination class of every REST list endpoint: strict limit/offset with a cap on the page size."""

from drf_spectacular.utils import OpenApiParameter
from rest_framework import pagination, serializers

# `?limit=100000000` must not read a user's whole history in one request: a larger page is refused with 400.
MAX_PAGE_SIZE = 200
# Past this MariaDB's OFFSET stops being a sensible request; it is far beyond any user's row count.
MAX_OFFSET = 2**31 - 1


class LimitOffsetPagination(pagination.LimitOffsetPagination):
    """DRF's limit/offset pagination, except that a bad or too large value is an error instead of silently the default.

    The default page is PAGE_SIZE; at most MAX_PAGE_SIZE items a page, as the OpenAPI document says.
    """

    max_limit = MAX_PAGE_SIZE

    def get_limit(self, request) -> int:
        return self._read(request, self.limit_query_param, minimum=1, maximum=MAX_PAGE_SIZE, default=self.default_limit)

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
            {"type": "integer", "minimum": 1, "maximum": MAX_PAGE_SIZE},
            description=f"{noun.capitalize()} per page (default 50, at most {MAX_PAGE_SIZE}).",
        ),
        OpenApiParameter(
            "offset",
            {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET},
            description=f"{noun.capitalize()} to skip, newest first.",
        ),
    ]
