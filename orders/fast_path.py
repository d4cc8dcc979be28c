"""The order creation's fast path: the common order request answered without DRF's dispatch and request parsing.

The common request: POST, Content-Type exactly application/json, no query string, Accept absent, */* or
application/json, ``Authorization: Token <key>``, an Idempotency-Key that idempotency_key_valid accepts or none, and a
JSON object of exactly goods_name and total that the view's input serializer accepts. The fast path answers it with
the view's own configuration, read from the view on every request as DRF's dispatch reads it: a view instance and the
DRF request its initialize_request builds (its authenticators, parsers and content negotiator), then its content
negotiation and versioning, its check_permissions, its throttles (get_throttles), its exception handler
(handle_exception) and its finalize_response (the negotiated renderer, the view's headers). What it saves is the rest
of DRF's path: request.data's stream and parser dispatch, and a second Redis round trip (below). Changing an
authenticator, a permission, a throttle, a parser or a renderer on the view therefore changes the fast path's answer
as it changes DRF's (orders/tests/test_fast_path_view.py).

Three steps the fast path does its own way, each only where it is the view's own step, and otherwise it steps aside
(returns None, and the DRF view answers from the start), which is the one choice that cannot differ from DRF:
- Authentication: the view's first authenticator must be a TokenAuthentication whose authenticate is DRF's; its
  authenticate_credentials is called as DRF would call it (DRF tries no other authenticator after one that answers).
- The body: the parser the view's negotiator selects for application/json must be core.parsers.JSONParser, whose
  parse is strict_loads.
- Dispatch: the view must not override APIView's dispatch, initial or perform_authentication, which it replaces.
Stepping aside for these, rather than reproducing every variant, keeps the fast path the size of the one request it is
for; running the rest through the view's own methods, rather than stepping aside whenever they change, keeps it right
for any permission, throttle or renderer without a list of the ones it knows. Those methods cost what they cost DRF's
dispatch (a view instance, a DRF request, the instances their classes make), less than what the fast path
saves, and nothing is cached between requests, so a view changed at run time is read as changed.

The token and the throttle's count come in one Redis round trip where the authenticator can (a token this process has
seen: accounts/authentication.token_by_key_counted). Counting before the permissions are checked is DRF's order only
when they cannot refuse an authenticated user, so the look-up counts only when every permission the view returns is
one of ALLOWS_ANY_USER, its check_throttles is APIView's and its one throttle counts under the key the look-up uses;
otherwise the look-up counts nothing and the view's check_permissions and check_throttles run in DRF's order. The body
is parsed and validated before the token, so a request handed to the DRF view has had nothing counted or written
(orders/tests/test_fast_path.py compares the two paths' answers, header for header). The view
(orders/apis.OrderListCreateApi) builds its fast path with order_create_fast_for and calls it first.
"""

import functools
import re
from collections.abc import Callable

from rest_framework import exceptions, serializers
from rest_framework.authentication import TokenAuthentication
from rest_framework.parsers import get_encoding
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.response import Response
from rest_framework.throttling import UserRateThrottle
from rest_framework.views import APIView

from core.parsers import JSONParser, strict_loads
from core.throttling import SharedCacheUserRateThrottle
from orders import services
from orders.idempotency import IDEMPOTENCY_META_KEY, idempotency_key_valid

# Text every rule of the goods_name field takes as it is: printable ASCII without surrounding spaces, so trimming
# changes nothing and no control, format or surrogate character is in it. Most names are such text.
PLAIN_TEXT = re.compile(r"[!-~](?:[ -~]*[!-~])?")
ORDER_FIELDS = frozenset({"goods_name", "total"})
# What the common order request sends: no Accept header, */* or JSON; JSON without parameters.
FAST_ACCEPT = frozenset({None, "*/*", "application/json"})
FAST_CONTENT_TYPE = "application/json"
# Permissions that let every authenticated user through: with only these the token's look-up may count the request.
ALLOWS_ANY_USER = (AllowAny, IsAuthenticated)
# APIView's steps the fast path takes itself: a view that overrides one is answered by DRF.
REPLACED_STEPS = ("dispatch", "initial", "perform_authentication")


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


def order_create_fast_for(
    view_class: type[APIView], *, answer: Callable[[services.OrderPlacement], Response]
) -> Callable[[object], Response | None]:
    """Return the fast path of `view_class`'s order POST: a function of a Django request that returns the view's
    answer to the common order request (module docstring), or None for any other request.

    The view gives what its POST does: `view_class.order_input` (the valid body's fields, or the serializer's
    ValidationError) and `answer` (the Response for a placed order); everything else is read from the view.
    """
    order_input = view_class.order_input

    def order_create_fast(request) -> Response | None:
        meta = request.META
        if (
            request.method != "POST"
            or meta.get("CONTENT_TYPE") != FAST_CONTENT_TYPE
            or meta.get("QUERY_STRING")
            or meta.get("HTTP_ACCEPT") not in FAST_ACCEPT
            or any(getattr(view_class, name) is not getattr(APIView, name) for name in REPLACED_STEPS)
        ):
            return None
        scheme, _, api_key = meta.get("HTTP_AUTHORIZATION", "").partition(" ")
        idempotency_key = meta.get(IDEMPOTENCY_META_KEY)
        if not api_key or api_key.strip() != api_key:
            return None
        if idempotency_key is not None and not idempotency_key_valid(idempotency_key):
            return None
        # APIView.dispatch's start, with the view's own methods.
        view = view_class()
        view.setup(request)
        drf_request = view.initialize_request(request)
        view.request = drf_request
        view.headers = view.default_response_headers
        authenticator = _token_authenticator(drf_request, scheme)
        if authenticator is None:
            return None
        # The body before the token: the look-up may count the request under the user's rate limit, and a request
        # handed to the DRF view must not have been counted (the view counts it).
        if type(drf_request.negotiator.select_parser(drf_request, drf_request.parsers)) is not JSONParser:
            return None
        try:
            data = strict_loads(request.body.decode(get_encoding(drf_request.parser_context)))
        except (exceptions.ParseError, UnicodeDecodeError):
            return None
        # Not an order's two fields: DRF's view answers the 400, building the error serializer once, not here as well.
        if not isinstance(data, dict) or data.keys() != ORDER_FIELDS:
            return None
        try:
            fields = order_input(data)
            # APIView.initial's steps before authentication: a request they refuse is the DRF view's to answer.
            view.format_kwarg = view.get_format_suffix(**view.kwargs)
            drf_request.accepted_renderer, drf_request.accepted_media_type = view.perform_content_negotiation(
                drf_request
            )
            drf_request.version, drf_request.versioning_scheme = view.determine_version(drf_request)
        except (serializers.ValidationError, exceptions.APIException):
            return None
        throttle = _counting_throttle(view)
        try:
            user, token, count = _authenticated(authenticator, api_key, throttle)
        except exceptions.AuthenticationFailed:
            return None
        except Exception as exc:
            # A database the look-up needs is down, say: answered as the view answers it.
            return view.finalize_response(drf_request, view.handle_exception(exc))
        # From here on the answer is DRF's: the user its authentication sets, the permissions, the throttles, the post.
        drf_request._authenticator = authenticator
        drf_request.user, drf_request.auth = user, token
        try:
            view.check_permissions(drf_request)
            if count is None:
                view.check_throttles(drf_request)
            elif not throttle.allows(count):
                view.throttled(drf_request, throttle.wait())
            response = answer(services.order_create(user=user, idempotency_key=idempotency_key, **fields))
        except Exception as exc:
            response = view.handle_exception(exc)  # raises what the view would let propagate
        return view.finalize_response(drf_request, response)

    return order_create_fast


def _token_authenticator(drf_request, scheme: str) -> TokenAuthentication | None:
    """Return the view's first authenticator when it is DRF's token authentication for `scheme`, else None."""
    authenticators = drf_request.authenticators
    if not authenticators:
        return None
    first = authenticators[0]
    if (
        not isinstance(first, TokenAuthentication)
        or type(first).authenticate is not TokenAuthentication.authenticate
        or scheme != first.keyword
    ):
        return None
    return first


def _counting_throttle(view: APIView) -> SharedCacheUserRateThrottle | None:
    """Return the throttle the token's look-up may count the request under, or None (module docstring)."""
    if type(view).check_throttles is not APIView.check_throttles:
        return None
    if not all(type(permission) in ALLOWS_ANY_USER for permission in view.get_permissions()):
        return None
    throttles = view.get_throttles()
    if len(throttles) != 1:
        return None
    throttle = throttles[0]
    if not isinstance(throttle, SharedCacheUserRateThrottle) or (
        type(throttle).get_cache_key is not UserRateThrottle.get_cache_key
    ):
        return None
    return throttle


def _authenticated(authenticator, api_key: str, throttle) -> tuple[object, object, int | None]:
    """Return the token's user, the token and, where the authenticator counted the request in the same round trip as
    the token (accounts/authentication.token_by_key_counted) under `throttle`, its count; else None."""
    if throttle is not None and (counted := getattr(authenticator, "authenticate_credentials_counted", None)):
        return counted(api_key, throttle)
    user, token = authenticator.authenticate_credentials(api_key)
    return user, token, None
