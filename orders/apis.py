"""REST endpoints for orders and the transaction check-back: validate, call a service or selector, serialize."""

import functools
import re
from collections.abc import Mapping
from typing import NamedTuple

from django.conf import settings
from django.core.validators import RegexValidator
from django.http import Http404
from django.utils.cache import patch_vary_headers
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions, serializers, status
from rest_framework.authentication import TokenAuthentication
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api import exception_handler
from core.contract import ORDER_TOTAL_MAX, ORDER_TOTAL_MIN
from core.fields import (
    PRINTABLE_TEXT_PATTERN,
    UNPRINTABLE_MESSAGE,
    StrictCharField,
    StrictIntegerField,
    refuse_unprintable,
)
from core.openapi import RETRY_AFTER, error_responses
from core.pagination import LimitOffsetPagination, page_parameters
from core.parsers import JSONParser, strict_loads
from core.throttling import SharedCacheUserRateThrottle
from credits.selectors import CreditStatus
from orders import selectors, services

IDEMPOTENCY_HEADER = "Idempotency-Key"
IDEMPOTENCY_KEY_MAX = 255
# The IETF draft (httpapi-idempotency-key-header) makes the key a structured-field string: printable ASCII, 0x20 to
# 0x7E. The same rule as a JSON Schema pattern, for the OpenAPI document.
IDEMPOTENCY_KEY_PATTERN = "^[ -~]*$"
IDEMPOTENCY_KEY_RULE = f"1 to {IDEMPOTENCY_KEY_MAX} printable ASCII characters (0x20 to 0x7E)"
# Read from META, as request.headers would find it: building request.headers costs more than the look-up.
IDEMPOTENCY_META_KEY = "HTTP_" + IDEMPOTENCY_HEADER.upper().replace("-", "_")


def idempotency_key_valid(key: str) -> bool:
    """Return whether `key` is an Idempotency-Key this API accepts (IDEMPOTENCY_KEY_RULE)."""
    # isprintable() refuses the control characters (tab, DEL); isascii() what WSGI decoded from bytes over 0x7E.
    return 1 <= len(key) <= IDEMPOTENCY_KEY_MAX and key.isascii() and key.isprintable()


class OrderOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    user_id = serializers.IntegerField()
    goods_name = serializers.CharField()
    total = serializers.IntegerField()
    transaction_id = serializers.CharField()
    credit_status = serializers.ChoiceField(
        choices=[CreditStatus.PENDING, CreditStatus.AWARDED, CreditStatus.DEAD_LETTERED, CreditStatus.UNKNOWN]
    )
    created_at = serializers.DateTimeField()


class OrderPageSerializer(serializers.Serializer):
    """The envelope LimitOffsetPagination answers with (documentation only)."""

    count = serializers.IntegerField()
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = OrderOutputSerializer(many=True)


ORDER_EXAMPLE = OpenApiExample(
    "order",
    value={
        "id": 42,
        "user_id": 7,
        "goods_name": "coffee beans",
        "total": 3,
        "transaction_id": "3f2c9a0e8b7d4c1fa6e5d4c3b2a19087",
        "credit_status": "pending",
        "created_at": "2026-11-22T23:05:00.123456Z",
    },
    response_only=True,
    status_codes=[200, 201],
)


_DATETIME = serializers.DateTimeField()


def order_data(order) -> dict:
    """Return what OrderOutputSerializer(order).data returns, without building a serializer for each new order.

    Order creation is the API's hot path and a serializer instance deep-copies its fields first: 0.2 ms of CPU per
    request (docs/PERFORMANCE.md). test_apis checks the two agree field for field.
    """
    return {
        "id": order.id,
        "user_id": order.user_id,
        "goods_name": order.goods_name,
        "total": order.total,
        "transaction_id": order.transaction_id,
        "credit_status": order.credit_status,
        "created_at": _DATETIME.to_representation(order.created_at),
    }


@functools.cache
def _order_input_serializer(serializer_class: type[serializers.Serializer]) -> serializers.Serializer:
    serializer = serializer_class()
    serializer.fields  # noqa: B018 (bound once, before threads share it)
    return serializer


# Text every rule of the goods_name field takes as it is: printable ASCII without surrounding spaces, so trimming
# changes nothing and no control, format or surrogate character is in it. Most names are such text.
PLAIN_TEXT = re.compile(r"[!-~](?:[ -~]*[!-~])?")
ORDER_FIELDS = frozenset({"goods_name", "total"})


@functools.cache
def _plain_order_limits(serializer_class: type[serializers.Serializer]) -> tuple[int, int, int, int]:
    """Return (min length, max length, min total, max total) as the input serializer's fields declare them."""
    fields = _order_input_serializer(serializer_class).fields
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


class OrderThrottle(SharedCacheUserRateThrottle):
    """Per-user limit on order creation, read from ORDERS_RATE_LIMIT when the request arrives."""

    scope = "orders"

    def get_rate(self) -> str | None:
        return settings.ORDERS_RATE_LIMIT


class OrderListCreateApi(APIView):
    # JSON only (the strict parser, which refuses hostile bodies): the strict fields refuse the strings a form would
    # send, so forms are 415, not a confusing 400.
    parser_classes = [JSONParser]

    class OrderInputSerializer(serializers.Serializer):
        goods_name = StrictCharField(
            min_length=1,
            max_length=255,
            validators=[RegexValidator(PRINTABLE_TEXT_PATTERN, UNPRINTABLE_MESSAGE), refuse_unprintable],
        )
        total = StrictIntegerField(min_value=ORDER_TOTAL_MIN, max_value=ORDER_TOTAL_MAX)

        def to_internal_value(self, data):
            # Report unknown fields (say a client-supplied user_id) together with the other field errors.
            errors, value = {}, None
            try:
                value = super().to_internal_value(data)
            except serializers.ValidationError as exc:
                errors = dict(exc.detail)
            if isinstance(data, Mapping):
                errors.update({name: ["Unknown field."] for name in sorted(set(data) - set(self.fields))})
            if errors:
                raise serializers.ValidationError(errors)
            return value

    def get_throttles(self):
        return [OrderThrottle()] if self.request.method == "POST" else []

    @classmethod
    def order_input(cls, data) -> dict:
        """Return the order fields of a valid body; raise what OrderInputSerializer(data=data).is_valid(
        raise_exception=True) raises for any other.

        A valid body is validated by one serializer kept for the process: a serializer instance deep-copies its
        declared fields first, about 4% of a loaded gunicorn worker's CPU per order (cProfile, 2026-11-25). Its
        validation keeps no state on the instance, so threads may share it. An invalid body goes through a serializer
        of its own, so its 400 is the same, error for error.
        """
        if (fields := plain_order_fields(cls.OrderInputSerializer, data)) is not None:
            return fields
        try:
            return _order_input_serializer(cls.OrderInputSerializer).run_validation(data)
        except serializers.ValidationError:
            serializer = cls.OrderInputSerializer(data=data)
            serializer.is_valid(raise_exception=True)
            raise

    @extend_schema(
        operation_id="orders_list",
        parameters=page_parameters("orders"),
        responses={200: OrderPageSerializer, **error_responses(400, 401)},
    )
    def get(self, request):
        paginator = LimitOffsetPagination()
        page = paginator.paginate_queryset(selectors.order_list(user=request.user), request, view=self)
        orders = selectors.orders_with_credit_status(page)
        return paginator.get_paginated_response(OrderOutputSerializer(orders, many=True).data)

    @extend_schema(
        operation_id="orders_create",
        request=OrderInputSerializer,
        responses={
            201: OpenApiResponse(OrderOutputSerializer, description="The order, new or (same key and body) replayed."),
            **error_responses(400, 401, 413, 415, 422, 429),
        },
        parameters=[
            OpenApiParameter(
                IDEMPOTENCY_HEADER,
                {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": IDEMPOTENCY_KEY_MAX,
                    "pattern": IDEMPOTENCY_KEY_PATTERN,
                },
                OpenApiParameter.HEADER,
                description=f"Retries with the same key and body return the same order ({IDEMPOTENCY_KEY_RULE}; "
                "a UUID is a good key). Any other value is a 400 naming the header, and nothing is written.",
                examples=[OpenApiExample("uuid", value="5b0c8f7e-4a3d-4e2b-9c1a-0d9e8f7a6b5c")],
            ),
            OpenApiParameter(
                "Idempotent-Replayed",
                {"type": "string", "enum": ["true"]},
                OpenApiParameter.HEADER,
                response=[201],
                description="Present when this answer replays the order an earlier request with the key created.",
            ),
            RETRY_AFTER,
        ],
        examples=[
            OpenApiExample("order", value={"goods_name": "coffee beans", "total": 3}, request_only=True),
            ORDER_EXAMPLE,
        ],
    )
    def post(self, request):
        key = request.META.get(IDEMPOTENCY_META_KEY)
        if key is not None and not idempotency_key_valid(key):
            raise serializers.ValidationError({IDEMPOTENCY_HEADER: [f"Must be {IDEMPOTENCY_KEY_RULE}."]})
        placement = services.order_create(user=request.user, idempotency_key=key, **self.order_input(request.data))
        return placement_answer(placement)

    @classmethod
    def as_view(cls, **initkwargs):
        """Return the DRF view behind the fast path of the common order (order_create_fast): the same answers."""
        view = super().as_view(**initkwargs)

        @functools.wraps(view)  # keeps what DRF and the schema generator read: cls, initkwargs, csrf_exempt
        def order_view(request, *args, **kwargs):
            return order_create_fast(request) or view(request, *args, **kwargs)

        return order_view


def placement_answer(placement: services.OrderPlacement) -> Response:
    """Return the 201 answer for a placed order, new or (same key and body) replayed."""
    order = placement.order
    if placement.created:
        order.credit_status = selectors.CREDIT_PENDING
    else:
        selectors.orders_with_credit_status([order])
    headers = {} if placement.created else {"Idempotent-Replayed": "true"}
    return Response(order_data(order), status=status.HTTP_201_CREATED, headers=headers)


# What the common order request sends: no Accept header, */* or JSON; JSON without parameters; an API token.
FAST_ACCEPT = frozenset({None, "*/*", "application/json"})
FAST_CONTENT_TYPE = "application/json"


class ViewParts(NamedTuple):
    """What OrderListCreateApi answers a JSON request with: its first authenticator and renderer, its headers."""

    authenticator: object
    renderer: object
    headers: dict


@functools.cache
def _view_parts() -> ViewParts:
    view = OrderListCreateApi()
    view.setup(None)
    return ViewParts(view.get_authenticators()[0], view.get_renderers()[0], dict(view.default_response_headers))


def order_create_fast(request) -> Response | None:
    """Answer the common order request without DRF's request, negotiation and dispatch; None for any other request.

    The common request: POST, Content-Type exactly application/json, no query string, Accept absent, */* or
    application/json, ``Authorization: Token <key>`` that the view's first authenticator (a TokenAuthentication)
    accepts, an Idempotency-Key that idempotency_key_valid accepts or none, and a JSON object of exactly goods_name
    and total that OrderInputSerializer accepts. For it DRF's answer is known before it runs: the first renderer
    (JSON), the token's user, IsAuthenticated passed, then the throttle, the service and the 201 (or the error the
    exception handler makes of what they raise). This runs those same steps, with the same functions, and answers with a
    Response finalized as the view finalizes one, without DRF's request wrapper, negotiation, parser selection and
    dispatch: 0.8 to 0.7 ms of CPU per request in process (docs/PERFORMANCE.md, "Order creation"). The token and
    the throttle's count come in one Redis round trip where the authenticator can (a token this process has seen:
    accounts/authentication.token_by_key_counted), so the body is checked first.

    Everything else, and every request that fails a check above, returns None before anything is counted or
    written, and the DRF view answers it from the start (orders/tests/test_fast_path.py compares the two paths'
    answers, header for header).
    """
    authenticator = _view_parts().authenticator
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
    # The body before the token: the look-up may count the request under the user's rate limit, and a request handed
    # to the DRF view must not have been counted (the view counts it).
    try:
        data = strict_loads(request.body.decode())
    except (exceptions.ParseError, UnicodeDecodeError):
        return None
    # Not an order's two fields: DRF's view answers the 400, building the error serializer once, not here as well.
    if not isinstance(data, dict) or data.keys() != ORDER_FIELDS:
        return None
    try:
        fields = OrderListCreateApi.order_input(data)
    except serializers.ValidationError:
        return None
    throttle = OrderThrottle()
    try:
        user, count = _authenticated(authenticator, api_key, throttle)
    except exceptions.AuthenticationFailed:
        return None
    except Exception as exc:
        # A database the look-up needs is down, say: answered as the view's exception handler answers it.
        if (response := _handled(exc)) is None:
            raise
        return response
    # From here on the answer is DRF's: the user its authentication would set, the throttle, the service.
    request.user = user
    try:
        if not (throttle.allow_request(request, None) if count is None else throttle.allows(count)):
            raise exceptions.Throttled(throttle.wait())
        placement = services.order_create(user=user, idempotency_key=idempotency_key, **fields)
    except Exception as exc:
        if (response := _handled(exc)) is None:
            raise
        return response
    return _finalized(placement_answer(placement))


def _authenticated(authenticator, api_key: str, throttle: OrderThrottle) -> tuple[object, int | None]:
    """Return the token's user and, where the authenticator counted the request in the same round trip as the token
    (accounts/authentication.token_by_key_counted), its count under `throttle`; else None, and the throttle counts."""
    if (counted := getattr(authenticator, "authenticate_credentials_counted", None)) is not None:
        user, _, count = counted(api_key, throttle)
        return user, count
    user, _ = authenticator.authenticate_credentials(api_key)
    return user, None


def _handled(exc: Exception) -> Response | None:
    """Return the view's answer to `exc` (APIView.handle_exception), or None when the view would let it propagate."""
    response = exception_handler(exc, {})
    if response is not None:
        response.exception = True
        response = _finalized(response)
    return response


def _finalized(response: Response) -> Response:
    """Give `response` the renderer and headers APIView.finalize_response gives it on a request negotiated to JSON."""
    _, renderer, headers = _view_parts()
    response.accepted_renderer = renderer
    response.accepted_media_type = renderer.media_type
    response.renderer_context = {}
    headers = dict(headers)
    if (vary := headers.pop("Vary", None)) is not None:
        patch_vary_headers(response, [vary])
    for name, value in headers.items():
        response[name] = value
    return response


class OrderDetailApi(APIView):
    @extend_schema(responses={200: OrderOutputSerializer, **error_responses(401, 404)}, examples=[ORDER_EXAMPLE])
    def get(self, request, order_id: int):
        order = selectors.order_get(user=request.user, order_id=order_id)
        if order is None:
            raise Http404
        return Response(OrderOutputSerializer(order).data)


class TransactionCheckApi(APIView):
    class CheckBackSerializer(serializers.Serializer):
        transaction_id = serializers.CharField()
        business = serializers.CharField()
        foreign_key = serializers.CharField()
        state = serializers.CharField()

    @extend_schema(responses={200: CheckBackSerializer, **error_responses(401, 404)})
    def get(self, request, transaction_id: str):
        result = selectors.transaction_check(user=request.user, transaction_id=transaction_id)
        if result is None:
            raise Http404
        return Response(self.CheckBackSerializer(result).data)
