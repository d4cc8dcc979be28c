"""The order's fast path (orders/fast_path.py) takes what the view declares: authenticators, permissions, throttles,
parsers and renderers changed on OrderListCreateApi change the ordinary order's answer as they change DRF's.

Each test first places an ordinary order, so that whatever the fast path keeps for the process (its token's user, a
view it built) is in place, then changes the view and sends the same ordinary order: the answer must be the DRF
view's, and a refused order must leave no row behind.
"""

import json
import re

import pytest
from django.test import Client
from rest_framework import renderers
from rest_framework.authentication import SessionAuthentication
from rest_framework.parsers import FormParser
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.throttling import BaseThrottle

from accounts.services import api_token_create
from orders import apis
from orders.models import IdempotencyKey, Order
from outbox.models import TransactionLog

# Orders commit in their own transaction, as in production: no test case's transaction may hold them.
pytestmark = pytest.mark.usefixtures("committed_db")

URL = "/api/orders/"
VALID = {"goods_name": "book", "total": 3}
VIEW = apis.OrderListCreateApi


class Refuse(BasePermission):
    message = "Orders are closed."

    def has_permission(self, request, view):
        return False


class RefuseThrottle(BaseThrottle):
    def allow_request(self, request, view):
        return False

    def wait(self):
        return 7


class IndentedJSONRenderer(renderers.JSONRenderer):
    def get_indent(self, accepted_media_type, renderer_context):
        return 4


@pytest.fixture
def key(user):
    return api_token_create(user=user)[1]


@pytest.fixture
def fast(monkeypatch) -> list:
    """Record what the fast path returned for each request (None: it handed the request to the DRF view)."""
    returned = []
    order_create_fast = apis.order_create_fast

    def recorded(request):
        returned.append(response := order_create_fast(request))
        return response

    monkeypatch.setattr(apis, "order_create_fast", recorded)
    return returned


def send(key, **headers):
    return Client().post(
        URL, json.dumps(VALID), content_type="application/json", HTTP_AUTHORIZATION=f"Token {key}", **headers
    )


def rows() -> tuple[int, int, int]:
    return Order.objects.count(), TransactionLog.objects.count(), IdempotencyKey.objects.count()


def drf_answer(monkeypatch, key, **headers):
    """Return the DRF view's own answer to the ordinary order (the fast path turned off), with what it wrote undone
    by the caller's row counts."""
    with monkeypatch.context() as patch:
        patch.setattr(apis, "order_create_fast", lambda request: None)
        return send(key, **headers)


def without_csrf_token(content: bytes) -> bytes:
    """Return `content` less the CSRF token a browsable page embeds, new on every request."""
    return re.sub(rb'"csrfToken": "[^"]*"', b"", content)


def seen(response) -> tuple:
    return response.status_code, response["Content-Type"], response.get("Retry-After"), response.content


def test_a_refusing_permission_on_the_view_refuses_the_ordinary_order_with_nothing_written(monkeypatch, key, fast):
    assert send(key).status_code == 201
    before = rows()
    monkeypatch.setattr(VIEW, "permission_classes", [IsAuthenticated, Refuse])

    response = send(key, HTTP_IDEMPOTENCY_KEY="k")

    assert response.status_code == 403
    assert response.json() == {"detail": "Orders are closed."}
    assert fast[-1] is not None  # answered by the fast path, not handed to the DRF view
    assert rows() == before
    assert seen(response) == seen(drf_answer(monkeypatch, key, HTTP_IDEMPOTENCY_KEY="k"))
    assert rows() == before


def test_a_refused_order_is_not_counted_under_the_rate_limit(monkeypatch, settings, key, fast, throttle_clock_stopped):
    settings.ORDERS_RATE_LIMIT = "2/minute"
    assert send(key).status_code == 201
    with monkeypatch.context() as patch:
        patch.setattr(VIEW, "permission_classes", [Refuse])
        assert send(key).status_code == 403

    # DRF checks the permissions before the throttle: the refused order took none of the minute's two.
    assert send(key).status_code == 201
    assert send(key).status_code == 429
    assert None not in fast
    assert Order.objects.count() == 2


def test_a_throttle_set_on_the_view_throttles_the_ordinary_order(monkeypatch, key, fast):
    assert send(key).status_code == 201
    before = rows()
    monkeypatch.setattr(VIEW, "get_throttles", lambda view: [RefuseThrottle()])

    response = send(key)

    assert response.status_code == 429
    assert response["Retry-After"] == "7"
    assert fast[-1] is not None
    assert rows() == before
    assert seen(response) == seen(drf_answer(monkeypatch, key))
    assert rows() == before


def test_authenticators_without_the_token_refuse_the_ordinary_order(monkeypatch, key, fast):
    assert send(key).status_code == 201
    before = rows()
    monkeypatch.setattr(VIEW, "authentication_classes", [SessionAuthentication])

    response = send(key)

    assert response.status_code == 403  # no authenticator takes the token: not authenticated, no challenge to send
    assert rows() == before
    assert seen(response) == seen(drf_answer(monkeypatch, key))


def test_parsers_without_json_refuse_the_ordinary_order(monkeypatch, key, fast):
    assert send(key).status_code == 201
    before = rows()
    monkeypatch.setattr(VIEW, "parser_classes", [FormParser])

    response = send(key)

    assert response.status_code == 415
    assert rows() == before
    assert seen(response) == seen(drf_answer(monkeypatch, key))


@pytest.mark.parametrize(
    "renderer_classes",
    [[IndentedJSONRenderer], [renderers.BrowsableAPIRenderer, renderers.JSONRenderer]],
    ids=["indented JSON", "browsable API first"],
)
def test_the_views_renderers_render_the_ordinary_orders_answer(monkeypatch, key, fast, renderer_classes):
    assert send(key, HTTP_IDEMPOTENCY_KEY="k").status_code == 201
    monkeypatch.setattr(VIEW, "renderer_classes", renderer_classes)

    # The same key and body: a replay, the same order in both answers.
    response = send(key, HTTP_IDEMPOTENCY_KEY="k")
    slow = drf_answer(monkeypatch, key, HTTP_IDEMPOTENCY_KEY="k")

    assert response.status_code == slow.status_code == 201
    assert fast[-1] is not None
    assert response["Content-Type"] == slow["Content-Type"]
    assert without_csrf_token(response.content) == without_csrf_token(slow.content)
    assert Order.objects.count() == 1
