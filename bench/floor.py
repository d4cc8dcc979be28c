"""The framework floor for bench_orders.py: Django settings whose only URL is an empty DRF view.

`POST /api/orders/` here answers 201 with a small JSON body and does nothing else: no authentication, no database, no
wake-up. Served by the same gunicorn, middleware and DRF as the real endpoint, it measures what the stack costs before
the application does any work, so the order figures can be read against it.

    DJANGO_SETTINGS_MODULE=floor PYTHONPATH=bench gunicorn config.wsgi
"""

from django.urls import path
from rest_framework.response import Response
from rest_framework.views import APIView

from config.settings import *  # noqa: F403 (the service's settings, unchanged but for the URLs)

ROOT_URLCONF = "floor"


class EmptyApi(APIView):
    authentication_classes = []
    permission_classes = []

    def post(self, request):
        return Response({"id": 0, "credit_status": "pending"}, status=201)

    def get(self, request):
        return Response({"status": "ok"})


urlpatterns = [path("api/orders/", EmptyApi.as_view()), path("healthz", EmptyApi.as_view())]
