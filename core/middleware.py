"""Middleware that refuses oversized request bodies with 413 before anything reads them."""

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse


class BodySizeLimitMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit = settings.API_MAX_BODY_BYTES
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return JsonResponse({"detail": "Content-Length is not a number."}, status=400)
        if length > limit and request.path.startswith("/api/"):
            return JsonResponse({"detail": f"Request body is larger than {limit} bytes."}, status=413)
        return self.get_response(request)
