"""The OpenAPI document tells the truth: schemathesis' conformance checks and a generated client, against gunicorn."""

import importlib
import os
import subprocess
import sys
import uuid

import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck
from schemathesis.config import SchemathesisConfig

from accounts.services import api_token_create
from credits.services import credit_award
from testkit.harness import VENV_BIN

pytestmark = pytest.mark.slow

# Every check on, including the ones off by default. Reusing an Idempotency-Key with another body is a conflict
# this API answers with 422 (the contract), where schemathesis expects 409 by default.
CONFIG = SchemathesisConfig.from_dict(
    {
        "checks": {
            "enabled": True,
            "positive_data_acceptance": {"expected-statuses": ["2xx", "401", "404", "422", "429"]},
            # Schemathesis' own list, and 414: a query string past gunicorn's request-line limit (core/openapi.py).
            "negative_data_rejection": {
                "expected-statuses": [
                    "400",
                    "401",
                    "403",
                    "404",
                    "405",
                    "406",
                    "409",
                    "414",
                    "415",
                    "422",
                    "428",
                    "429",
                    "5xx",
                ]
            },
        }
    }
)
EXAMPLES = hypothesis.settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.fixture
def token(user) -> str:
    return api_token_create(user=user)[1]


@pytest.fixture
def live_schema(live_web, transactional_db):
    return schemathesis.openapi.from_url(f"{live_web.base_url}/api/schema/", config=CONFIG)


schema = schemathesis.pytest.from_fixture("live_schema")


@schema.parametrize()
@EXAMPLES
def test_every_operation_answers_as_documented(case, token):
    # Every built-in check: status codes, content types, response schemas and headers, plus the negative ones.
    case.call_and_validate(headers={"Authorization": f"Token {token}"})


def test_links_lead_from_a_placed_order_to_its_reads(live_web, transactional_db, token):
    document = requests.get(f"{live_web.base_url}/api/schema/?format=json", timeout=10).json()
    links = document["paths"]["/api/orders/"]["post"]["responses"]["201"]["links"]
    assert {link["operationId"] for link in links.values()} == {"orders_retrieve", "transactions_retrieve"}

    workflow = schemathesis.openapi.from_url(f"{live_web.base_url}/api/schema/", config=CONFIG).as_state_machine()

    class AuthenticatedWorkflow(workflow):
        def get_call_kwargs(self, case):
            return {"headers": {"Authorization": f"Token {token}"}}

    AuthenticatedWorkflow.run(
        settings=hypothesis.settings(
            max_examples=15, stateful_step_count=6, deadline=None, suppress_health_check=list(HealthCheck)
        )
    )


@pytest.fixture
def generated_client(live_web, tmp_path, monkeypatch):
    """Generate a typed client package from the served document into tmp_path and import it."""
    document = tmp_path / "openapi.json"
    document.write_bytes(requests.get(f"{live_web.base_url}/api/schema/?format=json", timeout=10).content)
    package = tmp_path / "creditshop_client"
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"}  # its post-hooks run ruff
    subprocess.run(
        [VENV_BIN / "openapi-python-client", "generate", "--path", document, "--meta", "none"]
        + ["--output-path", package, "--fail-on-warning"],
        check=True,
        env=env,
        capture_output=True,
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield importlib.import_module("creditshop_client")
    for name in [name for name in sys.modules if name.startswith("creditshop_client")]:
        del sys.modules[name]


def test_a_generated_client_places_replays_lists_and_reads(generated_client, live_web, transactional_db, user, token):
    from creditshop_client import AuthenticatedClient
    from creditshop_client.api.credits_ import credits_retrieve
    from creditshop_client.api.orders import orders_create, orders_list, orders_retrieve
    from creditshop_client.models import CreditStatusEnum, OrderInput, OrderOutput, OrderPage

    client = AuthenticatedClient(
        base_url=live_web.base_url, token=token, prefix="Token", raise_on_unexpected_status=True
    )
    key = str(uuid.uuid4())
    body = OrderInput(goods_name="coffee beans", total=3)

    placed = orders_create.sync_detailed(client=client, body=body, idempotency_key=key)
    replayed = orders_create.sync_detailed(client=client, body=body, idempotency_key=key)
    conflict = orders_create.sync(client=client, body=OrderInput(goods_name="tea", total=3), idempotency_key=key)

    assert placed.status_code == 201 and isinstance(placed.parsed, OrderOutput)
    assert placed.parsed.credit_status is CreditStatusEnum.PENDING
    assert replayed.parsed.id == placed.parsed.id and replayed.headers["Idempotent-Replayed"] == "true"
    assert conflict.detail
    page = orders_list.sync(client=client, limit=10)
    assert isinstance(page, OrderPage) and page.count == 1 and [o.id for o in page.results] == [placed.parsed.id]

    credit_award(
        transaction_id=placed.parsed.transaction_id,
        order_id=placed.parsed.id,
        user_id=user.pk,
        total=placed.parsed.total,
    )
    order = orders_retrieve.sync(client=client, order_id=placed.parsed.id)
    credits = credits_retrieve.sync(client=client)

    assert order.credit_status is CreditStatusEnum.AWARDED
    assert credits.balance == 6 and [entry.order_id for entry in credits.entries] == [placed.parsed.id]
    assert orders_retrieve.sync(client=client, order_id=placed.parsed.id + 1).detail == "Not found."
