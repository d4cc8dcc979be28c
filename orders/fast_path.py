"""The order creation's fast path: the common order request answered without DRF's request, negotiation and dispatch.

The common request: POST, Content-Type exactly application/json, no query string, Accept absent, */* or
application/json, ``Authorization: Token <key>`` that the view's first authenticator (a TokenAuthentication) accepts,
an Idempotency-Key that idempotency_key_valid accepts or none, and a JSON object of exactly goods_name and total that
the view's input serializer accepts. For it DRF's answer is known before it runs: the first renderer (JSON), the
token's user, IsAuthenticated passed, then the throttle, the service and the 201 (or the error the exception handler
makes of what they raise). The fast path runs those same steps, with the same functions, and answers with a Response
finalized as the view finalizes one, for about an eighth less CPU per request in process (docs/PERFORMANCE.md, "Order
creation"). The token and the throttle's count come in one Redis round trip where the authenticator can (a token this
process has seen: accounts/authentication.token_by_key_counted), so the body is checked first.

Everything else, and every request that fails a check above, gets None before anything is counted or written, and
the DRF view answers it from the start (orders/tests/test_fast_path.py compares the two paths' answers, header for
header). The view (orders/apis.OrderListCreateApi) builds its fast path with order_create_fast_for and calls it first.
"""

import functools
import re
from collections.abc import Callable
from typing import NamedTuple

from django.utils.cache import patch_vary_headers
from rest_framework import exceptions, serializers
from rest_framework.authentication import TokenAuthentication
from rest_framework.response import Response

from core.api import exception_handler
from core.parsers import strict_loads
from orders import services
from orders.idempotency import IDEMPOTENCY_META_KEY, idempotency_key_valid

# Text every rule of the goods_name field takes as it is: printable ASCII without surrounding spaces, so trimming
# changes nothing and no control, format or surrogate character is in it. Most names are such text.
PLAIN_TEXT = re.compile(r"[!-~](?:[ -~]*[!-~])?")
ORDER_FIELDS = frozenset({"goods_name", "total"})
# What the common order request sends: no Accept header, */* or JSON; JSON without parameters.
FAST_ACCEPT = frozenset({None, "*/*", "application/json"})
FAST_CONTENT_TYPE = "application/json"


@functools.cache
def shared_serializer(serializer_class: type[serializers.Serializer]) -> serializers.Serializer:
    """Return the one instance of `serializer_class` this process validates plain bodies with, its fields bound."""
    serializer = serializer_class()
    serializer.fields  # noqa: B018 (bound once, before threads share it)
    return serializer


@functools.cache
def _plain_order_limits(serializer_class: type[serializers.Serializer]) -> tuple[int, int, int, int]:
    """Return (min length, max length, min total, max total) as the input serializer's fields declare them."""
    fields = shared_serializer(serializer_class).fields
    name, total = fields["goods_name"], fields["total"]
    return name.min_length, name.max_length, total.min_value, total.max_value


def plain_order_fields(serializer_class: type[serializers.Serializer], data) -> dict | None:
    """Return what `serializer_class` validates `data` to when that is plain to see, else None (run the serializer).

    Plain: exactly goods_name and total, the name PLAIN_TEXT within the field's lengths, the total a JSON integer
    within its bounds. The serializer returns such values unchanged (orders/tests/test_fast_path.py checks the two
    agree on generated bodies), at a small part of the serializer's CPU (docs/PERFORMANCE.md, "Order creation").
    """
    if type(data) is not dict or data.keys() != ORDER_FIELDS:
        return None
    goods_name, total = data["goods_name"], data["total"]
    name_min, name_max, total_min, total_max = _plain_order_limits(serializer_class)
    if (
        type(goods_name) is str
        and type(total) is int
        and name_min <= len(goods_name) <= name_max
        and total_min <= total <= total_max
        and PLAIN_TEXT.fullmatch(goods_name)
    ):
        return {"goods_name": goods_name, "total": total}
    return None


class ViewParts(NamedTuple):
    """What a view answers a JSON request with: its first authenticator and renderer, its headers."""

    authenticator: object
    renderer: object
    headers: dict


def order_create_fast_for(
    view_class: type, *, throttle_class: type, answer: Callable[[services.OrderPlacement], Response]
) -> Callable[[object], Response | None]:
    """Return the fast path of `view_class`'s order POST: a function of a Django request that returns the view's
    answer to the common order request (module docstring), or None for any other request.

    The view gives what its POST uses: `view_class.order_input` (the valid body's fields, or the serializer's
    ValidationError), `throttle_class` and `answer` (the Response for a placed order).
    """
    order_input = view_class.order_input

    @functools.cache
    def view_parts() -> ViewParts:
        view = view_class()
        view.setup(None)
        return ViewParts(view.get_authenticators()[0], view.get_renderers()[0], dict(view.default_response_headers))

    def order_create_fast(request) -> Response | None:
        parts = view_parts()
        authenticator = parts.authenticator
        meta = request.META
        if (
            not isinstance(authenticator, TokenAuthentication)
            or request.method != "POST"
            or meta.get("CONTENT_TYPE") != FAST_CONTENT_TYPE
            or meta.get("QUERY_STRING")
            or meta.get("HTTP_ACCEPT") not in FAST_ACCEPT
        ):
            return None
        scheme, _, api_key = meta.get("HTTP_AUTHORIZATION", "").partition(" ")
        idempotency_key = meta.get(IDEMPOTENCY_META_KEY)
        if scheme != authenticator.keyword or not api_key or api_key.strip() != api_key:
            return None
        if idempotency_key is not None and not idempotency_key_valid(idempotency_key):
            return None
        # The body before the token: the look-up may count the request under the user's rate limit, and a request
        # handed to the DRF view must not have been counted (the view counts it).
        try:
            data = strict_loads(request.body.decode())
        except (exceptions.ParseError, UnicodeDecodeError):
            return None
        # Not an order's two fields: DRF's view answers the 400, building the error serializer once, not here as well.
        if not isinstance(data, dict) or data.keys() != ORDER_FIELDS:
            return None
        try:
            fields = order_input(data)
        except serializers.ValidationError:
            return None
        throttle = throttle_class()
        try:
            user, count = _authenticated(authenticator, api_key, throttle)
        except exceptions.AuthenticationFailed:
            return None
        except Exception as exc:
            # A database the look-up needs is down, say: answered as the view's exception handler answers it.
            if (response := _handled(exc, parts)) is None:
                raise
            return response
        # From here on the answer is DRF's: the user its authentication would set, the throttle, the service.
        request.user = user
        try:
            if not (throttle.allow_request(request, None) if count is None else throttle.allows(count)):
                raise exceptions.Throttled(throttle.wait())
            placement = services.order_create(user=user, idempotency_key=idempotency_key, **fields)
        except Exception as exc:
            if (response := _handled(exc, parts)) is None:
                raise
            return response
        return _finalized(answer(placement), parts)

    return order_create_fast


def _authenticated(authenticator, api_key: str, throttle) -> tuple[object, int | None]:
    """Return the token's user and, where the authenticator counted the request in the same round trip as the token
    (accounts/authentication.token_by_key_counted), its count under `throttle`; else None, and the throttle counts."""
    if (counted := getattr(authenticator, "authenticate_credentials_counted", None)) is not None:
        user, _, count = counted(api_key, throttle)
        return user, count
    user, _ = authenticator.authenticate_credentials(api_key)
    return user, None


def _handled(exc: Exception, parts: ViewParts) -> Response | None:
    """Return the view's answer to `exc` (APIView.handle_exception), or None when the view would let it propagate."""
    response = exception_handler(exc, {})
    if response is not None:
        response.exception = True
        response = _finalized(response, parts)
    return response


def _finalized(response: Response, parts: ViewParts) -> Response:
    """Give `response` the renderer and headers APIView.finalize_response gives it on a request negotiated to JSON."""
    renderer = parts.renderer
    response.accepted_renderer = renderer
    response.accepted_media_type = renderer.media_type
    response.renderer_context = {}
    headers = dict(parts.headers)
    if (vary := headers.pop("Vary", None)) is not None:
        patch_vary_headers(response, [vary])
    for name, value in headers.items():
        response[name] = value
    return response
