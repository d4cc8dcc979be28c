"""The one place that turns domain errors into HTTP responses for the REST API."""

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import OperationalError
from django.http import HttpResponsePermanentRedirect, JsonResponse
from django.urls import Resolver404, resolve
from django.views.defaults import page_not_found
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from core.errors import ApplicationError

DATABASE_RETRY_AFTER_SECONDS = 5


def exception_handler(exc, context):
    """Answer ApplicationError with its status and message; leave everything else to DRF."""
    if isinstance(exc, ApplicationError):
        return Response({"detail": exc.message, **exc.extra}, status=exc.status)
    if isinstance(exc, RequestDataTooBig):
        return Response({"detail": "Request body is too large."}, status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    if isinstance(exc, OperationalError):
        # A database this request needs (the credits service's, say) is down: the client may retry later.
        return Response(
            {"detail": "A database this request needs is not answering; try again shortly."},
            status=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": str(DATABASE_RETRY_AFTER_SECONDS)},
        )
    return drf_exception_handler(exc, context)


def api_not_found(request):
    """Answer any path under /api/ that no API route matches with the API's JSON 404, in DEBUG too.

    The last route under api/: Django's DEBUG 404 page (an HTML page) would otherwise answer instead of handler404. A
    path that only lacks its trailing slash is redirected as CommonMiddleware would, had this route not matched it.
    """
    if settings.APPEND_SLASH and not request.path_info.endswith("/"):
        try:
            match = resolve(request.path_info + "/")
        except Resolver404:
            match = None
        if match is not None and match.func is not api_not_found:
            return HttpResponsePermanentRedirect(request.get_full_path(force_append_slash=True))
    return JsonResponse({"detail": "Not found."}, status=status.HTTP_404_NOT_FOUND)


def not_found(request, exception):
    """Answer an unknown URL under /api/ with the API's JSON 404 body, and everything else with Django's page."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Not found."}, status=status.HTTP_404_NOT_FOUND)
    return page_not_found(request, exception)
