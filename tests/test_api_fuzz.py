"""Schema-driven fuzzing of the REST API from /api/schema/: no input yields a 5xx or an order without its log row."""

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accounts.services import api_token_create
from config.wsgi import application
from orders.models import Order
from outbox.models import TransactionLog

pytestmark = pytest.mark.slow  # a minute of generated requests


@pytest.fixture
def api_schema(transactional_db):
    return schemathesis.openapi.from_wsgi("/api/schema/", application)


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.fixture
def token(user, settings) -> str:
    settings.ORDERS_RATE_LIMIT = None
    return api_token_create(user=user)[1]


@schema.parametrize()
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_input_gives_a_server_error_or_an_order_without_its_message(case, token):
    response = case.call(headers={"Authorization": f"Token {token}"})

    assert response.status_code < 500, f"{case.method} {case.formatted_path} -> {response.status_code}"
    orders = set(Order.objects.values_list("transaction_id", flat=True))
    messages = set(TransactionLog.objects.values_list("id", flat=True))
    assert orders == messages


def _nested(depth: int, leaf: str) -> str:
    return "[" * depth + leaf + "]" * depth


def _order(goods_name: str, total: str) -> str:
    return '{"goods_name": ' + goods_name + ', "total": ' + total + "}"


_NAME = st.sampled_from(['"tea"', '"x"'])
_TOTAL = st.sampled_from(["1", "10000"])
# Bodies no honest client sends: each must be refused with a 4xx, never crash the parser or reach the database.
hostile_bodies = st.one_of(
    st.builds(_order, st.integers(33, 30_000).flatmap(lambda d: st.just(_nested(d, '"x"'))), _TOTAL),
    st.builds(lambda d: '{"goods_name": ' + "[" * d, st.integers(1, 60_000)),
    st.builds(_order, _NAME, st.integers(5, 6_000).map(lambda n: "9" * n)),
    st.builds(_order, _NAME, st.sampled_from(["1e400", "-1e400", "1e309", "NaN", "Infinity", "-Infinity", "1.5"])),
    st.builds(_order, st.integers(256, 70_000).map(lambda n: '"' + "x" * n + '"'), _TOTAL),
    st.builds(
        lambda key, first, second: f'{{"goods_name": "tea", "total": 1, "{key}": {first}, "{key}": {second}}}',
        st.sampled_from(["goods_name", "total", "extra"]),
        _TOTAL,
        _TOTAL,
    ),
)


@given(body=hostile_bodies)
@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
def test_a_hostile_body_is_refused_with_a_4xx_and_writes_nothing(body, token, client):
    response = client.generic(
        "POST", "/api/orders/", body, content_type="application/json", HTTP_AUTHORIZATION=f"Token {token}"
    )

    assert 400 <= response.status_code < 500, (response.status_code, body[:200])
    assert not Order.objects.exists()
    assert not TransactionLog.objects.exists()
