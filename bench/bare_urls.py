"""The bare lower bound for bench_orders.py: the service's own order path with every framework layer it can skip.

A URLconf (selected by the settings in bench/bare.py) whose ``POST /api/orders/`` is one Django function view that
does only the work our guarantees need, through the service's own functions: the API token from the shared cache
(``accounts.authentication.token_by_key``), the per-user counter in Redis (``core.throttling.window_count_incr``),
the JSON body, ``orders.services.order_create`` (the one-round-trip batch with the idempotency record, the relay's
wake-up) and the answer (``orders.apis.order_data``). No DRF request, negotiation, serializer or renderer; the
checks of a bad body or header are reduced to what keeps the bench honest (a wrong body is a 400, not an error page).

It is not an endpoint to serve: it answers no error in the documented shape and keeps no OpenAPI promise. It is the
floor of this design on this stack, so the ratio to the plain endpoint that even a perfect rewrite of the web layer
could reach is measured, not argued (docs/PERFORMANCE.md, "Order creation"). Served by the same gunicorn, settings
and middleware as the service:

    DJANGO_SETTINGS_MODULE=bare PYTHONPATH=bench gunicorn config.wsgi
"""

import functools
import json
import time

from django.conf import settings
from django.core.cache import caches
from django.http import HttpResponse, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from rest_framework.throttling import SimpleRateThrottle

from accounts.authentication import token_by_key
from config.urls import urlpatterns as service_urlpatterns
from core.throttling import window_count_incr
from orders import selectors
from orders.apis import IDEMPOTENCY_META_KEY, order_data
from orders.services import IdempotencyKeyReused, order_create


@functools.cache
def _rate(rate: str) -> tuple[int, int]:
    return SimpleRateThrottle.parse_rate(None, rate)


def _refused(status: int, detail: str) -> JsonResponse:
    return JsonResponse({"detail": detail}, status=status)


@csrf_exempt
def bare_order_create(request):
    if request.method != "POST":
        return _refused(405, "Method not allowed.")
    scheme, _, key = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    token = token_by_key(key) if scheme == "Token" and key else None
    if token is None or token.is_expired() or not token.user.is_active:
        return _refused(401, "Invalid token.")
    user = token.user
    if settings.ORDERS_RATE_LIMIT:
        limit, duration = _rate(settings.ORDERS_RATE_LIMIT)
        window = int(time.time() // duration)
        count = window_count_incr(caches["default"], f"throttle_orders_{user.pk}:{window}", ttl=int(duration) + 1)
        if count > limit:
            return _refused(429, "Request was throttled.")
    try:
        body = json.loads(request.body)
        goods_name, total = body["goods_name"], body["total"]
    except (ValueError, TypeError, KeyError):
        return _refused(400, "A JSON object with goods_name and total is required.")
    if not (isinstance(goods_name, str) and 1 <= len(goods_name) <= 255 and type(total) is int and total >= 1):
        return _refused(400, "goods_name must be 1 to 255 characters, total a positive integer.")
    try:
        placement = order_create(
            user=user, goods_name=goods_name, total=total, idempotency_key=request.META.get(IDEMPOTENCY_META_KEY)
        )
    except IdempotencyKeyReused as exc:
        return _refused(422, str(exc))
    if placement.created:
        placement.order.credit_status = selectors.CREDIT_PENDING
    else:
        selectors.orders_with_credit_status([placement.order])
    return HttpResponse(json.dumps(order_data(placement.order)), status=201, content_type="application/json")


urlpatterns = [path("api/orders/", bare_order_create), *service_urlpatterns]
