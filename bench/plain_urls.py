"""The plain baseline for bench_orders.py: the order endpoint as a user of a Django outbox library would write it.

A URLconf (selected by the settings in bench/plain.py) whose ``POST /api/orders/`` is the textbook version:
DRF's stock ``TokenAuthentication`` and ``UserRateThrottle`` (counting in the same Redis cache, at the same
ORDERS_RATE_LIMIT), a ``ModelSerializer``, and ``Order.objects.create`` plus the outbox row through
``TransactionLog.objects.create`` (the same payload the service writes) in one ``transaction.atomic``. No
Idempotency-Key and no wake-up: the dedicated relay finds the rows by polling. Every other URL is the service's, so
/healthz and the rest answer as usual. Served by the same gunicorn, middleware and settings as the service:

    DJANGO_SETTINGS_MODULE=plain PYTHONPATH=bench gunicorn config.wsgi
"""

from django.conf import settings
from django.db import transaction
from django.urls import path
from rest_framework import serializers, status
from rest_framework.authentication import TokenAuthentication
from rest_framework.response import Response
from rest_framework.throttling import UserRateThrottle
from rest_framework.views import APIView

from config.urls import urlpatterns as service_urlpatterns
from core.contract import BUSINESS_ORDER, SCHEMA_VERSION
from orders.models import Order
from outbox.ids import new_transaction_id
from outbox.models import TransactionLog


class PlainOrderSerializer(serializers.ModelSerializer):
    class Meta:
        model = Order
        fields = ["id", "user_id", "goods_name", "total", "transaction_id", "created_at"]
        read_only_fields = ["id", "user_id", "transaction_id", "created_at"]


class PlainOrderThrottle(UserRateThrottle):
    def get_rate(self):
        return settings.ORDERS_RATE_LIMIT


class PlainOrderCreateApi(APIView):
    authentication_classes = [TokenAuthentication]
    throttle_classes = [PlainOrderThrottle]

    def post(self, request):
        serializer = PlainOrderSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        with transaction.atomic():
            order = serializer.save(user=request.user, transaction_id=new_transaction_id())
            TransactionLog.objects.create(
                id=order.transaction_id,
                business=BUSINESS_ORDER,
                foreign_key=str(order.pk),
                payload={
                    "schema_version": SCHEMA_VERSION,
                    "transaction_id": order.transaction_id,
                    "order_id": order.pk,
                    "user_id": request.user.pk,
                    "total": order.total,
                },
            )
        return Response(serializer.data, status=status.HTTP_201_CREATED)


urlpatterns = [path("api/orders/", PlainOrderCreateApi.as_view()), *service_urlpatterns]
