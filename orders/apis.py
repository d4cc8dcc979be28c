"""REST endpoints for orders and the transaction check-back: validate, call a service or selector, serialize."""

import unicodedata
from collections.abc import Mapping

from django.conf import settings
from django.http import Http404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from config.pagination import LimitOffsetPagination
from config.throttling import SharedCacheUserRateThrottle
from orders import selectors, services

IDEMPOTENCY_HEADER = "Idempotency-Key"
IDEMPOTENCY_KEY_MAX = 255


class StrictIntegerField(serializers.IntegerField):
    """An integer field that refuses strings, floats and booleans instead of coercing them."""

    default_error_messages = {"invalid": "A JSON integer is required."}

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictCharField(serializers.CharField):
    """A text field that refuses numbers and other non-strings instead of converting them."""

    default_error_messages = {"invalid": "A JSON string is required."}

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


def refuse_control_characters(value: str) -> None:
    if any(unicodedata.category(ch) in ("Cc", "Cf", "Cs") for ch in value):
        raise serializers.ValidationError("Control and format characters are not allowed.")


class OrderOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    user_id = serializers.IntegerField()
    goods_name = serializers.CharField()
    total = serializers.IntegerField()
    transaction_id = serializers.CharField()
    credit_status = serializers.CharField()
    created_at = serializers.DateTimeField()


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
    class OrderInputSerializer(serializers.Serializer):
        goods_name = StrictCharField(max_length=255, validators=[refuse_control_characters])
        total = StrictIntegerField(min_value=1, max_value=10_000)

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

    @extend_schema(responses=OrderOutputSerializer(many=True))
    def get(self, request):
        paginator = LimitOffsetPagination()
        page = paginator.paginate_queryset(selectors.order_list(user=request.user), request, view=self)
        orders = selectors.orders_with_credit_status(page)
        return paginator.get_paginated_response(OrderOutputSerializer(orders, many=True).data)

    @extend_schema(
        request=OrderInputSerializer,
        responses={201: OrderOutputSerializer},
        parameters=[
            OpenApiParameter(
                IDEMPOTENCY_HEADER,
                str,
                OpenApiParameter.HEADER,
                description="Retries with the same key and body return the same order (at most 255 characters).",
            )
        ],
    )
    def post(self, request):
        key = request.headers.get(IDEMPOTENCY_HEADER)
        if key is not None and not 1 <= len(key) <= IDEMPOTENCY_KEY_MAX:
            raise serializers.ValidationError({IDEMPOTENCY_HEADER: [f"Must be 1 to {IDEMPOTENCY_KEY_MAX} characters."]})
        serializer = self.OrderInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        placement = services.order_create(user=request.user, idempotency_key=key, **serializer.validated_data)
        order = placement.order
        if placement.created:
            order.credit_status = selectors.CREDIT_PENDING
        else:
            selectors.orders_with_credit_status([order])
        headers = {} if placement.created else {"Idempotent-Replayed": "true"}
        return Response(order_data(order), status=status.HTTP_201_CREATED, headers=headers)


class OrderDetailApi(APIView):
    @extend_schema(responses=OrderOutputSerializer)
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

    @extend_schema(responses={200: CheckBackSerializer, 404: None})
    def get(self, request, transaction_id: str):
        result = selectors.transaction_check(user=request.user, transaction_id=transaction_id)
        if result is None:
            raise Http404
        return Response(self.CheckBackSerializer(result).data)
