"""The orders REST API: creation, validation, idempotency over HTTP, access control, check-back, pagination."""

import json

import pytest
from rest_framework.test import APIClient

from core.pagination import MAX_PAGE_SIZE
from orders.models import Order
from orders.services import order_create
from outbox.models import TransactionLog

# Orders commit in their own transaction, as in production: no test case's transaction may hold them.
pytestmark = pytest.mark.usefixtures("committed_db")

URL = "/api/orders/"
VALID = {"goods_name": "book", "total": 3}


def post(client, body, **headers):
    return client.post(URL, body, format="json", **headers)


def assert_nothing_written():
    assert Order.objects.count() == 0
    assert TransactionLog.objects.count() == 0


def test_create_returns_the_contract_fields(api, user):
    response = post(api, VALID)

    assert response.status_code == 201
    body = response.json()
    assert set(body) == {"id", "user_id", "goods_name", "total", "transaction_id", "credit_status", "created_at"}
    assert body["user_id"] == user.pk
    assert (body["goods_name"], body["total"], body["credit_status"]) == ("book", 3, "pending")
    assert TransactionLog.objects.filter(pk=body["transaction_id"], foreign_key=str(body["id"])).exists()
    # The create answer is built without a serializer (orders.apis.order_data); it must equal the serialized read.
    assert api.get(f"{URL}{body['id']}/").json() == body


def test_inactive_users_token_is_refused(api, user):
    user.is_active = False
    user.save()

    response = post(api, VALID)

    assert response.status_code == 401
    assert "inactive" in response.json()["detail"]
    assert_nothing_written()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"total": 3}, "goods_name"),
        ({"goods_name": "", "total": 3}, "goods_name"),
        ({"goods_name": "   ", "total": 3}, "goods_name"),
        ({"goods_name": "x" * 256, "total": 3}, "goods_name"),
        ({"goods_name": "bad\x00name", "total": 3}, "goods_name"),
        ({"goods_name": "bad\x07name", "total": 3}, "goods_name"),
        ({"goods_name": "bad\u202ename", "total": 3}, "goods_name"),
        ({"goods_name": None, "total": 3}, "goods_name"),
        ({"goods_name": 42, "total": 3}, "goods_name"),
        ({"goods_name": ["book"], "total": 3}, "goods_name"),
        ({"goods_name": "book"}, "total"),
        ({"goods_name": "book", "total": 0}, "total"),
        ({"goods_name": "book", "total": -1}, "total"),
        ({"goods_name": "book", "total": 10_001}, "total"),
        ({"goods_name": "book", "total": "3"}, "total"),
        ({"goods_name": "book", "total": 3.0}, "total"),
        ({"goods_name": "book", "total": 2.5}, "total"),
        ({"goods_name": "book", "total": True}, "total"),
        ({"goods_name": "book", "total": None}, "total"),
        ({"goods_name": "book", "total": 10**30}, "total"),
        ({"goods_name": "book", "total": 3, "user_id": 999}, "user_id"),
        ({"goods_name": "book", "total": 3, "id": 1}, "id"),
    ],
)
def test_bad_body_answers_400_per_field_and_writes_nothing(api, body, field):
    response = post(api, body)

    assert response.status_code == 400, response.content
    assert field in response.json()
    assert_nothing_written()


def test_field_errors_and_unknown_fields_are_reported_together(api):
    response = post(api, {"goods_name": "", "total": 0, "user_id": 7})

    assert response.status_code == 400
    assert set(response.json()) == {"goods_name", "total", "user_id"}


@pytest.mark.parametrize("raw", ["[1, 2]", '"book"', "3", "null", "true"])
def test_non_object_json_is_400(api, raw):
    response = api.post(URL, raw, content_type="application/json")

    assert response.status_code == 400
    assert_nothing_written()


@pytest.mark.parametrize("raw", ["{", '{"goods_name": "book", "total": 3', "\xff\xfe", "{'a': 1}"])
def test_malformed_json_is_400(api, raw):
    response = api.post(URL, raw, content_type="application/json")

    assert response.status_code == 400
    assert_nothing_written()


def test_extreme_values_at_the_limits_are_accepted(api):
    response = post(api, {"goods_name": "é" * 255, "total": 10_000})

    assert response.status_code == 201
    assert Order.objects.get().goods_name == "é" * 255


def test_body_over_64_kib_is_413(api):
    response = post(api, {"goods_name": "x" * (70 * 1024), "total": 1})

    assert response.status_code == 413
    assert_nothing_written()


def test_missing_or_bad_token_is_401():
    anonymous = APIClient()
    assert post(anonymous, VALID).status_code == 401
    assert anonymous.get(URL).status_code == 401
    anonymous.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    assert post(anonymous, VALID).status_code == 401
    assert_nothing_written()


def test_idempotency_key_over_http(api):
    first = post(api, VALID, HTTP_IDEMPOTENCY_KEY="abc-123")
    again = post(api, VALID, HTTP_IDEMPOTENCY_KEY="abc-123")
    different = post(api, {"goods_name": "book", "total": 4}, HTTP_IDEMPOTENCY_KEY="abc-123")

    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()
    assert again.headers["Idempotent-Replayed"] == "true"
    assert different.status_code == 422
    assert different.json()["order_id"] == first.json()["id"]
    assert Order.objects.count() == 1


@pytest.mark.parametrize("key", ["", "k" * 256, "a\tb", "a\x00b", "a\x7fb", "caf\u00e9", "\u00ff" * 10])
def test_bad_idempotency_key_is_400(api, key):
    response = post(api, VALID, HTTP_IDEMPOTENCY_KEY=key)

    assert response.status_code == 400
    assert "Idempotency-Key" in response.json()
    assert_nothing_written()


@pytest.mark.parametrize("key", ["k", "k" * 255, " !~", "5b0c8f7e-4a3d-4e2b-9c1a-0d9e8f7a6b5c", "a b"])
def test_printable_ascii_idempotency_keys_are_accepted(api, key):
    assert post(api, VALID, HTTP_IDEMPOTENCY_KEY=key).status_code == 201
    assert post(api, VALID, HTTP_IDEMPOTENCY_KEY=key).headers["Idempotent-Replayed"] == "true"


def test_the_openapi_document_states_the_idempotency_key_rule(api):
    schema = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    operation = schema["paths"]["/api/orders/"]["post"]
    header = next(p for p in operation["parameters"] if p["name"] == "Idempotency-Key")

    assert header["schema"] == {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[ -~]*$"}
    assert "printable ASCII" in header["description"]


def test_rate_limit_answers_429_with_retry_after(api, settings, throttle_clock_stopped):
    settings.ORDERS_RATE_LIMIT = "3/minute"

    statuses = [post(api, VALID).status_code for _ in range(4)]
    limited = post(api, VALID)

    assert statuses == [201, 201, 201, 429]
    assert limited.status_code == 429
    assert int(limited.headers["Retry-After"]) > 0
    assert Order.objects.count() == 3


def test_rate_limit_none_turns_it_off(api, settings):
    settings.ORDERS_RATE_LIMIT = None

    assert {post(api, VALID).status_code for _ in range(30)} == {201}


def test_list_shows_only_own_orders_paginated(api, other_api):
    for i in range(7):
        post(api, {"goods_name": f"item {i}", "total": i + 1})
    post(other_api, VALID)

    page = api.get(URL, {"limit": 5}).json()
    rest = api.get(page["next"]).json()

    assert page["count"] == 7
    assert [o["goods_name"] for o in page["results"]] == [f"item {i}" for i in range(6, 1, -1)]
    assert [o["goods_name"] for o in rest["results"]] == ["item 1", "item 0"]
    assert rest["next"] is None


def test_a_page_is_never_larger_than_the_cap(api, user):
    for _ in range(MAX_PAGE_SIZE + 1):
        order_create(user=user, goods_name="tea", total=1)

    refused = api.get(URL, {"limit": 100_000_000})
    page = api.get(URL, {"limit": MAX_PAGE_SIZE}).json()

    assert refused.status_code == 400
    assert refused.json() == {"limit": [f"Must be between 1 and {MAX_PAGE_SIZE}."]}
    assert page["count"] == MAX_PAGE_SIZE + 1
    assert len(page["results"]) == MAX_PAGE_SIZE
    assert page["next"] is not None


def nested(depth: int, leaf: str = '"x"') -> str:
    return "[" * depth + leaf + "]" * depth


def order_body(*, goods_name: str = '"tea"', total: str = "1") -> str:
    """Return an order body with the given JSON texts as values."""
    return '{"goods_name": ' + goods_name + ', "total": ' + total + "}"


HOSTILE_BODIES = {
    "nested 10,000 deep": order_body(goods_name=nested(10_000)),
    "nested 60,000 deep, no closing": '{"goods_name": ' + "[" * 60_000,
    "nested past the depth cap": order_body(goods_name=nested(40)),
    "objects nested deep": order_body(goods_name='{"a": ' * 5_000 + "1" + "}" * 5_000),
    "number beyond float range": order_body(total="1e400"),
    "negative number beyond float range": order_body(total="-1e400"),
    "integer of 5,000 digits": order_body(total="9" * 5_000),
    "integer of 4,000 digits": order_body(total="9" * 4_000),
    "NaN": order_body(total="NaN"),
    "Infinity": order_body(total="Infinity"),
    "string of 60,000 characters": order_body(goods_name='"' + "x" * 60_000 + '"'),
    "string over the body limit": order_body(goods_name='"' + "x" * 100_000 + '"'),
    "duplicate key, same value": '{"goods_name": "tea", "total": 1, "total": 1}',
    "duplicate key, other value": '{"goods_name": "tea", "goods_name": "coffee", "total": 1}',
    "duplicate key in a nested object": order_body(goods_name='{"a": 1, "a": 2}'),
    "not UTF-8": b'{"goods_name": "\xff\xfe", "total": 1}',
    "truncated": '{"goods_name": "tea", "total": ',
    "empty": "",
    "null": "null",
    "a list": "[" + order_body() + "]",
}


@pytest.mark.parametrize("body", HOSTILE_BODIES.values(), ids=HOSTILE_BODIES.keys())
def test_a_malformed_or_hostile_body_is_a_4xx_and_writes_nothing(api, body):
    response = api.generic("POST", URL, body, content_type="application/json")

    assert 400 <= response.status_code < 500, response.content[:500]
    assert_nothing_written()


def test_a_body_with_a_duplicate_key_is_refused_with_a_reason(api):
    response = api.generic(
        "POST", URL, '{"goods_name": "tea", "total": 1, "total": 2}', content_type="application/json"
    )

    assert response.status_code == 400
    assert "duplicate key 'total'" in response.json()["detail"]


def test_detail_of_another_users_order_is_404(api, other_api):
    order_id = post(api, VALID).json()["id"]

    assert api.get(f"{URL}{order_id}/").status_code == 200
    assert other_api.get(f"{URL}{order_id}/").status_code == 404
    assert api.get(f"{URL}999999/").status_code == 404


def test_check_back_committed_for_owner_and_staff(api, make_user):
    created = post(api, VALID).json()
    staff = APIClient()
    staff.force_authenticate(make_user("operator", is_staff=True))

    for client in (api, staff):
        response = client.get(f"/api/transactions/{created['transaction_id']}/")
        assert response.status_code == 200
        assert response.json() == {
            "transaction_id": created["transaction_id"],
            "business": "order",
            "foreign_key": str(created["id"]),
            "state": "COMMITTED",
        }


def test_check_back_is_404_for_unknown_and_for_other_users(api, other_api):
    created = post(api, VALID).json()

    assert api.get("/api/transactions/0123456789abcdef0123456789abcdef/").status_code == 404
    assert api.get("/api/transactions/not-an-id/").status_code == 404
    assert api.get("/api/transactions/%C3%A9" + "0" * 31 + "/").status_code == 404
    assert api.get("/api/transactions/" + created["transaction_id"].upper() + "/").status_code == 404
    assert other_api.get(f"/api/transactions/{created['transaction_id']}/").status_code == 404


def test_check_back_outlives_the_published_log_row(api):
    created = post(api, VALID).json()
    TransactionLog.objects.filter(pk=created["transaction_id"]).delete()

    assert api.get(f"/api/transactions/{created['transaction_id']}/").json()["state"] == "COMMITTED"


def test_credits_of_a_new_user_are_zero(api):
    body = api.get("/api/credits/").json()

    assert body["balance"] == 0
    assert body["entries"] == []


def test_schema_and_docs_are_served(api):
    schema = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")

    assert schema.status_code == 200
    paths = json.loads(schema.content)["paths"]
    assert {"/api/orders/", "/api/orders/{order_id}/", "/api/transactions/{transaction_id}/", "/api/credits/"} <= set(
        paths
    )
    assert api.get("/api/docs/").status_code == 200


@pytest.mark.parametrize("name", ["a\u202eb", "\ud800", "tab\there", " ", "\U000e0001"])
def test_unprintable_goods_names_are_refused(api, name):
    # json.dumps escapes a lone surrogate as \ud800, as a hostile client would send it.
    response = api.post(URL, json.dumps({"goods_name": name, "total": 1}), content_type="application/json")

    assert response.status_code == 400 and "goods_name" in response.json()
    assert_nothing_written()


def test_orders_take_json_only(api):
    response = api.post("/api/orders/", {"goods_name": "tea", "total": 1}, format="multipart")

    assert response.status_code == 415


def test_valid_orders_share_one_input_serializer_and_a_bad_one_gets_its_own(api, monkeypatch):
    from orders.apis import OrderListCreateApi

    post(api, VALID)  # the shared serializer built
    built = []
    serializer_class = OrderListCreateApi.OrderInputSerializer
    real_init = serializer_class.__init__

    def init(self, *args, **kwargs):
        built.append(kwargs.get("data"))
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(serializer_class, "__init__", init)
    assert post(api, {"goods_name": "tea", "total": 2}).status_code == 201
    assert built == []
    response = post(api, {"goods_name": "", "total": 0, "user_id": 1})
    assert response.status_code == 400
    assert set(response.json()) == {"goods_name", "total", "user_id"}
    assert built == [{"goods_name": "", "total": 0, "user_id": 1}]
