"""bench/bare_urls.py, the floor variant of bench_orders.py: it places real orders through the service's functions."""

import json
import sys
from pathlib import Path

import pytest
from django.test import Client, override_settings

from accounts.services import api_token_create
from orders.models import IdempotencyKey, Order
from outbox.models import TransactionLog

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

pytestmark = pytest.mark.usefixtures("committed_db", "_bare_urls")


@pytest.fixture
def _bare_urls():
    with override_settings(ROOT_URLCONF="bare_urls", ORDERS_RATE_LIMIT="3/minute"):
        yield


def post(client, key, body, **headers):
    return client.post(
        "/api/orders/", json.dumps(body), content_type="application/json", HTTP_AUTHORIZATION=f"Token {key}", **headers
    )


@pytest.fixture
def key(user):
    return api_token_create(user=user)[1]


def test_places_an_order_with_its_outbox_row_and_idempotency_record(user, key):
    response = post(Client(), key, {"goods_name": "mug", "total": 3}, HTTP_IDEMPOTENCY_KEY="k-1")

    assert response.status_code == 201
    body = response.json()
    order = Order.objects.get(pk=body["id"])
    assert (order.user_id, order.goods_name, order.total) == (user.pk, "mug", 3)
    assert body["transaction_id"] == order.transaction_id and body["credit_status"] == "pending"
    assert TransactionLog.objects.get(pk=order.transaction_id).foreign_key == str(order.pk)
    assert IdempotencyKey.objects.get(user=user, key="k-1").order_id == order.pk


def test_a_retry_with_the_same_key_gets_the_same_order(key):
    first = post(Client(), key, {"goods_name": "mug", "total": 3}, HTTP_IDEMPOTENCY_KEY="k-1")
    again = post(Client(), key, {"goods_name": "mug", "total": 3}, HTTP_IDEMPOTENCY_KEY="k-1")
    other = post(Client(), key, {"goods_name": "mug", "total": 4}, HTTP_IDEMPOTENCY_KEY="k-1")

    assert (first.status_code, again.status_code, other.status_code) == (201, 201, 422)
    assert again.json()["id"] == first.json()["id"]
    assert Order.objects.count() == 1


def test_refuses_a_bad_token_a_bad_body_and_the_request_over_the_limit(key, throttle_clock_stopped):
    assert post(Client(), "not-a-key", {"goods_name": "mug", "total": 3}).status_code == 401
    assert post(Client(), key, {"goods_name": "", "total": 3}).status_code == 400
    assert post(Client(), key, {"goods_name": "mug", "total": "3"}).status_code == 400
    assert post(Client(), key, {"goods_name": "mug", "total": 3}).status_code == 201
    # The bad bodies count, as in the service (the throttle runs before the body is read): 3 a minute were used.
    assert post(Client(), key, {"goods_name": "mug", "total": 3}).status_code == 429
    assert Order.objects.count() == 1
