"""REST endpoints for orders and the transaction check-back: validate, call a service or selector, serialize."""

import functools
from collections.abc import Mapping

from django.conf import settings
from django.core.validators import RegexValidator
from django.http import Http404
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

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
from core.parsers import JSONParser
from core.throttling import SharedCacheUserRateThrottle
from credits.selectors import CreditStatus
from orders import selectors, services
from orders.fast_path import order_create_fast_for, plain_order_fields, shared_serializer
from orders.idempotency import (
    IDEMPOTENCY_HEADER,
    IDEMPOTENCY_KEY_MAX,
    IDEMPOTENCY_KEY_PATTERN,
    IDEMPOTENCY_KEY_RULE,
    IDEMPOTENCY_META_KEY,
    idempotency_key_valid,
)


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
        declared fields first, a cost every order would pay again. Its validation keeps no state on the instance, so
        threads may share it. An invalid body goes through a serializer
        of its own, so its 400 is the same, error for error.
        """
        if (fields := plain_order_fields(cls.OrderInputSerializer, data)) is not None:
            return fields
        try:
            return shared_serializer(cls.OrderInputSerializer).run_validation(data)
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


# The common order request's answer without DRF's request, negotiation and dispatch (orders/fast_path.py); None for
# any other request, which the DRF view answers.
order_create_fast = order_create_fast_for(OrderListCreateApi, answer=placement_answer)


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
