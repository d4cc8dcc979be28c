"""The bare lower bound for bench_orders.py: the service's own order path with every framework layer it can skip.

A URLconf (selected by the settings in bench/bare.py) whose ``POST /api/orders/`` is one Django function view that
does only the work our guarantees need, through the service's own functions: the API token from the shared cache
and the per-user counter in Redis (``orders.apis.OrderThrottle``), in one round trip for a token the process has seen
(``accounts.authentication.TokenAuthentication.authenticate_credentials_counted``), the JSON
body (plain values only, ``orders.fast_path.plain_order_fields``), ``orders.services.order_create`` (the one-round-trip
batch with the idempotency record, the relay's wake-up) and the answer (``orders.apis.order_data``). No DRF request,
negotiation, serializer or renderer; a body of anything but plain values is a 400 (the service would run its
serializer), so bad input is refused, not turned into an error page.

It is not an endpoint to serve: it answers no error in the documented shape and keeps no OpenAPI promise. It is the
floor of this design on this stack, so the ratio to the plain endpoint that even a perfect rewrite of the web layer
could reach is measured, not argued (docs/PERFORMANCE.md, "Order creation"). Served by the same gunicorn, settings
and middleware as the service:

    DJANGO_SETTINGS_MODULE=bare PYTHONPATH=bench gunicorn config.wsgi
"""

import json

from django.http import HttpResponse, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from rest_framework.exceptions import AuthenticationFailed

from accounts.authentication import TokenAuthentication
from config.urls import urlpatterns as service_urlpatterns
from orders import selectors
from orders.apis import OrderListCreateApi, OrderThrottle, order_data
from orders.fast_path import plain_order_fields
from orders.idempotency import IDEMPOTENCY_META_KEY
from orders.services import IdempotencyKeyReused, order_create


def _refused(status: int, detail: str) -> JsonResponse:
    return JsonResponse({"detail": detail}, status=status)


@csrf_exempt
def bare_order_create(request):
    if request.method != "POST":
        return _refused(405, "Method not allowed.")
    scheme, _, key = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    if scheme != "Token" or not key:
        return _refused(401, "Invalid token.")
    throttle = OrderThrottle()
    try:
        user, _, count = TokenAuthentication().authenticate_credentials_counted(key, throttle)
    except AuthenticationFailed:
        return _refused(401, "Invalid token.")
    request.user = user
    if not (throttle.allow_request(request, None) if count is None else throttle.allows(count)):
        return _refused(429, "Request was throttled.")
    try:
        fields = plain_order_fields(OrderListCreateApi.OrderInputSerializer, json.loads(request.body))
    except ValueError:
        fields = None
    if fields is None:
        return _refused(400, "A JSON object of goods_name (printable ASCII) and total (an integer in range) is needed.")
    try:
        placement = order_create(user=user, idempotency_key=request.META.get(IDEMPOTENCY_META_KEY), **fields)
    except IdempotencyKeyReused as exc:
        return _refused(422, str(exc))
    if placement.created:
        placement.order.credit_status = selectors.CREDIT_PENDING
    else:
        selectors.orders_with_credit_status([placement.order])
    return HttpResponse(json.dumps(order_data(placement.order)), status=201, content_type="application/json")


urlpatterns = [path("api/orders/", bare_order_create), *service_urlpatterns]
