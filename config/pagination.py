"""The one pagination class of every REST list endpoint: limit/offset with a cap on the page size."""

from rest_framework import pagination

# A page larger than this is cut to it: `?limit=100000000` must not read a user's whole history in one request.
MAX_PAGE_SIZE = 200


class LimitOffsetPagination(pagination.LimitOffsetPagination):
    """DRF's limit/offset pagination, with PAGE_SIZE as the default and at most MAX_PAGE_SIZE items a page."""

    max_limit = MAX_PAGE_SIZE
