"""The order creation's fast path (orders/fast_path.py): the DRF view's answer, header for header.

Each request is answered twice, once with the fast path and once with it turned off (the DRF view alone), on the
same database state, and the two answers must be equal but for what differs between any two orders (id,
transaction id, creation time). Requests the fast path does not take must leave it with nothing counted or written.
"""

import json
from datetime import timedelta

import pytest
from django.db import OperationalError
from django.test import Client
from django.utils import timezone
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from rest_framework.views import APIView

from accounts import authentication
from accounts.models import ApiToken
from accounts.services import api_token_create
from orders import apis, services
from orders.models import IdempotencyKey, Order
from testkit.redis_commands import RedisCommands

# Orders commit in their own transaction, as in production: no test case's transaction may hold them.
pytestmark = pytest.mark.usefixtures("committed_db")

URL = "/api/orders/"
VALID = {"goods_name": "book", "total": 3}
VARYING = {"id", "transaction_id", "created_at"}


@pytest.fixture
def key(user):
    return api_token_create(user=user)[1]


@pytest.fixture
def seen(monkeypatch) -> list:
    """Record what the fast path returned for each request (None: it handed the request to the DRF view)."""
    returned = []
    fast = apis.order_create_fast
    monkeypatch.setattr(apis, "order_create_fast", lambda request: returned.append(fast(request)))
    return returned


def send(key, body=VALID, *, content_type="application/json", **headers):
    raw = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return Client().post(URL, raw, content_type=content_type, HTTP_AUTHORIZATION=f"Token {key}", **headers)


def answer(response) -> tuple:
    """Return what a client sees of `response`, less what differs between two orders."""
    body = response.json()
    if isinstance(body, dict):
        body = {name: (type(value).__name__ if name in VARYING else value) for name, value in body.items()}
    headers = {name: value for name, value in response.headers.items() if name != "Content-Length"}
    return response.status_code, headers, body


def both(monkeypatch, request_once) -> tuple:
    """Return the answers to `request_once()` with the fast path and then without it."""
    fast = request_once()
    monkeypatch.setattr(apis, "order_create_fast", lambda request: None)
    slow = request_once()
    monkeypatch.undo()
    return fast, slow


def test_a_new_order_is_answered_as_the_drf_view_answers_it(monkeypatch, key):
    fast, slow = both(monkeypatch, lambda: send(key))

    assert fast.status_code == 201
    assert answer(fast) == answer(slow)
    assert Order.objects.count() == 2


@pytest.mark.parametrize("accept", [None, "*/*", "application/json"])
def test_the_common_accept_headers_are_answered_alike(monkeypatch, key, accept):
    headers = {} if accept is None else {"HTTP_ACCEPT": accept}
    keys = iter(["a", "b"])

    fast, slow = both(monkeypatch, lambda: send(key, HTTP_IDEMPOTENCY_KEY=next(keys), **headers))

    assert answer(fast) == answer(slow)


def test_a_replay_and_a_reused_key_are_answered_alike(monkeypatch, key):
    first = send(key, HTTP_IDEMPOTENCY_KEY="k")

    replays = both(monkeypatch, lambda: send(key, HTTP_IDEMPOTENCY_KEY="k"))
    reuses = both(monkeypatch, lambda: send(key, {"goods_name": "book", "total": 4}, HTTP_IDEMPOTENCY_KEY="k"))

    assert replays[0].headers["Idempotent-Replayed"] == "true"
    assert replays[0].json()["id"] == replays[1].json()["id"] == first.json()["id"]
    assert answer(replays[0]) == answer(replays[1])
    assert reuses[0].status_code == 422
    assert answer(reuses[0]) == answer(reuses[1])
    assert Order.objects.count() == 1


@pytest.mark.parametrize("idempotency_key", ["", "k" * 256, "a\tb", "a\nb", "a\x7fb", "caf\u00e9"])
def test_a_bad_idempotency_key_is_answered_alike(monkeypatch, key, idempotency_key):
    fast, slow = both(monkeypatch, lambda: send(key, HTTP_IDEMPOTENCY_KEY=idempotency_key))

    assert fast.status_code == 400
    assert list(fast.json()) == ["Idempotency-Key"]
    assert answer(fast) == answer(slow)
    assert Order.objects.count() == IdempotencyKey.objects.count() == 0


def test_the_throttle_counts_each_request_once_whichever_path_answers(
    monkeypatch, key, settings, throttle_clock_stopped
):
    settings.ORDERS_RATE_LIMIT = "4/minute"
    statuses = [send(key).status_code, send(key, {"total": 3}).status_code]
    with monkeypatch.context() as drf_only:
        drf_only.setattr(apis, "order_create_fast", lambda request: None)
        statuses.append(send(key).status_code)
    statuses += [send(key).status_code, send(key).status_code]

    assert statuses == [201, 400, 201, 201, 429]
    assert Order.objects.count() == 3


def test_a_throttled_order_is_answered_alike(monkeypatch, key, settings, throttle_clock_stopped):
    settings.ORDERS_RATE_LIMIT = "1/minute"
    # One instant for both answers: Retry-After counts whole seconds, which would differ across a second's turn.
    send(key)

    fast, slow = both(monkeypatch, lambda: send(key))

    assert fast.status_code == 429
    assert answer(fast) == answer(slow)
    assert Order.objects.count() == 1


@pytest.mark.parametrize("failing", [(authentication, "_read"), (services, "order_create")], ids=["token", "order"])
def test_a_database_outage_is_answered_alike(monkeypatch, key, failing):
    def database_down(*args, **kwargs):
        raise OperationalError(2013, "Lost connection to server during query")

    monkeypatch.setattr(*failing, database_down)
    fast = send(key)
    monkeypatch.setattr(apis, "order_create_fast", lambda request: None)
    slow = send(key)

    assert fast.status_code == 503
    assert answer(fast) == answer(slow)


def test_an_unexpected_error_is_raised_as_the_drf_view_raises_it(monkeypatch, key):
    def broken(**kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(services, "order_create", broken)
    client = Client(raise_request_exception=True)

    with pytest.raises(RuntimeError, match="a bug"):
        client.post(URL, json.dumps(VALID), content_type="application/json", HTTP_AUTHORIZATION=f"Token {key}")


def test_the_common_order_does_not_reach_drf(monkeypatch, key):
    """Fails if the fast path stops taking the common request (it would still pass every other test)."""

    def no_drf(*args, **kwargs):
        raise AssertionError("the DRF view ran")

    monkeypatch.setattr(APIView, "dispatch", no_drf)

    assert send(key, HTTP_IDEMPOTENCY_KEY="k").status_code == 201


def test_a_known_tokens_order_costs_one_redis_round_trip(monkeypatch, key):
    """Its token's row and its user's rate-limit count come in one round trip (fails if they come apart again)."""
    redis = RedisCommands(monkeypatch)

    first = redis.during(lambda: send(key))
    second = redis.during(lambda: send(key))

    assert first == ["GET", "SET", "EVALSHA"]  # a token new to this process: the look-up, then the throttle's count
    assert second == ["EVALSHA"]
    assert Order.objects.count() == 2


def expired(user):
    token, key = api_token_create(user=user, name="old")
    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    return key


@pytest.mark.parametrize(
    ("case", "request_kwargs"),
    [
        ("form body", {"body": "goods_name=book&total=3", "content_type": "application/x-www-form-urlencoded"}),
        ("charset parameter", {"content_type": "application/json; charset=utf-8"}),
        ("html accepted", {"HTTP_ACCEPT": "text/html"}),
        ("query string", {"QUERY_STRING": "format=json"}),
        ("not JSON", {"body": "{goods_name: book}"}),
        ("not UTF-8", {"body": b'{"goods_name": "\xff", "total": 3}'}),
        ("duplicate key", {"body": '{"goods_name": "a", "goods_name": "b", "total": 3}'}),
        ("a list", {"body": [VALID]}),
        ("missing field", {"body": {"goods_name": "book"}}),
        ("unknown field", {"body": {**VALID, "user_id": 1}}),
        ("blank name", {"body": {"goods_name": "  ", "total": 3}}),
        ("unprintable name", {"body": {"goods_name": "a\u200bb", "total": 3}}),
        ("total as text", {"body": {"goods_name": "book", "total": "3"}}),
        ("total as bool", {"body": {"goods_name": "book", "total": True}}),
        ("total too large", {"body": {"goods_name": "book", "total": 10_001}}),
        ("idempotency key too long", {"HTTP_IDEMPOTENCY_KEY": "k" * 256}),
        ("idempotency key empty", {"HTTP_IDEMPOTENCY_KEY": ""}),
        ("idempotency key with a tab", {"HTTP_IDEMPOTENCY_KEY": "a\tb"}),
        ("idempotency key with DEL", {"HTTP_IDEMPOTENCY_KEY": "a\x7fb"}),
        ("idempotency key not ASCII", {"HTTP_IDEMPOTENCY_KEY": "caf\u00e9"}),
    ],
)
def test_other_requests_go_to_the_drf_view_with_nothing_counted_or_written(settings, seen, key, case, request_kwargs):
    # One request a minute: had the fast path counted the request before handing it over, DRF's count would refuse it.
    settings.ORDERS_RATE_LIMIT = "1/minute"
    kwargs = dict(request_kwargs)
    body = kwargs.pop("body", VALID)

    response = send(key, body, **kwargs)

    assert seen == [None], case
    assert response.status_code != 429, case
    assert response.status_code != 201 or case in ("charset parameter", "html accepted", "query string"), case
    assert Order.objects.count() == (1 if response.status_code == 201 else 0), case
    assert IdempotencyKey.objects.count() == 0, case


@pytest.mark.parametrize("authorization", ["", "Bearer {key}", "token {key}", "Token  {key}", "Token", "Token nope"])
def test_other_credentials_go_to_the_drf_view(seen, key, authorization):

    Client().post(
        URL, json.dumps(VALID), content_type="application/json", HTTP_AUTHORIZATION=authorization.format(key=key)
    )

    assert seen == [None]


def test_an_expired_token_and_an_inactive_user_go_to_the_drf_view(seen, user, make_user):
    inactive = make_user("carol")
    inactive_key = api_token_create(user=inactive)[1]
    inactive.is_active = False
    inactive.save()

    statuses = [send(expired(user)).status_code, send(inactive_key).status_code]

    assert seen == [None, None]
    assert statuses == [401, 401]
    assert Order.objects.count() == 0


NAMES = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x7F), max_size=260),
    st.text(max_size=260),
    st.sampled_from(["book", " book", "book ", "a" * 255, "a" * 256, "", "b\x00", "x\ty", "ok name"]),
)
TOTALS = st.one_of(st.integers(-5, 10_005), st.booleans(), st.floats(), st.text(max_size=3), st.none())


@hypothesis_settings(max_examples=500, deadline=None)
@given(st.fixed_dictionaries({"goods_name": NAMES, "total": TOTALS}))
def test_plain_order_fields_are_what_the_serializer_makes_of_them(body):
    serializer = apis.OrderListCreateApi.OrderInputSerializer(data=body)
    plain = apis.plain_order_fields(apis.OrderListCreateApi.OrderInputSerializer, body)

    if plain is not None:
        assert serializer.is_valid(), serializer.errors
        assert plain == dict(serializer.validated_data)


@pytest.mark.parametrize(
    "body", [VALID, {"goods_name": "bench item", "total": 10_000}, {"goods_name": "A", "total": 1}]
)
def test_common_bodies_are_plain(body):
    assert apis.plain_order_fields(apis.OrderListCreateApi.OrderInputSerializer, body) == body


@pytest.mark.parametrize(
    "body",
    [{**VALID, "extra": 1}, {"goods_name": "café", "total": 3}, {"goods_name": " book", "total": 3}, [VALID], "x"],
)
def test_other_bodies_go_to_the_serializer(body):
    assert apis.plain_order_fields(apis.OrderListCreateApi.OrderInputSerializer, body) is None
