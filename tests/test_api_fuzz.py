"""Schema-driven fuzzing of the REST API from /api/schema/: no input yields a 5xx or an order without its log row."""

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from rest_framework.authtoken.models import Token

from config.wsgi import application
from orders.models import Order
from outbox.models import TransactionLog


@pytest.fixture
def api_schema(transactional_db):
    return schemathesis.openapi.from_wsgi("/api/schema/", application)


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.fixture
def token(user, settings) -> str:
    settings.ORDERS_RATE_LIMIT = None
    return Token.objects.create(user=user).key


@schema.parametrize()
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_input_gives_a_server_error_or_an_order_without_its_message(case, token):
    response = case.call(headers={"Authorization": f"Token {token}"})

    assert response.status_code < 500, f"{case.method} {case.formatted_path} -> {response.status_code}"
    orders = set(Order.objects.values_list("transaction_id", flat=True))
    messages = set(TransactionLog.objects.values_list("id", flat=True))
    assert orders == messages
