"""The API token cache (accounts/authentication.py): no database query while cached, and never stale after a change."""

import logging
import math
from datetime import UTC, datetime, timedelta

import pytest
from django.core.cache import caches
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.test import APIClient

from accounts import authentication
from accounts.keys import key_digest
from accounts.models import ApiToken
from accounts.services import api_token_create
from accounts.tests.support import client_for
from core import throttling
from testkit.processes import free_port
from testkit.redis_commands import RedisCommands

pytestmark = pytest.mark.django_db(transaction=True)


def list_orders(client: APIClient):
    return client.get("/api/orders/")


@pytest.fixture
def token(user) -> str:
    """A new API key of the user's."""
    return api_token_create(user=user)[1]


def delete_token(key: str) -> None:
    ApiToken.objects.get(digest=key_digest(key)).delete()


def cache_key(key: str) -> str:
    return authentication.token_cache_key(key_digest(key))


def token_queries(client: APIClient) -> list[str]:
    """Return the SQL statements of one request that read the token table."""
    with CaptureQueriesContext(connection) as ctx:
        assert list_orders(client).status_code == 200
    return [q["sql"] for q in ctx.captured_queries if ApiToken._meta.db_table in q["sql"]]


def test_a_cached_token_authenticates_without_reading_the_database(token):
    client = client_for(token)
    assert len(token_queries(client)) == 1  # first use: read and cached
    assert token_queries(client) == []
    assert caches["default"].get(cache_key(token)) is not None


def test_the_cached_user_is_the_user_as_read_from_the_database(token, user):
    authentication.token_by_key(token)  # caches the row
    cached = authentication.token_by_key(token).user
    fields = [field.attname for field in type(user)._meta.concrete_fields]
    user.refresh_from_db()
    assert [getattr(cached, f) for f in fields] == [getattr(user, f) for f in fields]
    assert cached._state.adding is False
    assert cached.last_login is None and cached.date_joined.tzinfo is not None


def test_the_cache_never_holds_the_password_hash_and_a_cached_user_still_reads_and_keeps_it(token, user):
    authentication.token_by_key(token)
    row, token_id, expires_at = caches["default"].get(cache_key(token))
    user.refresh_from_db()
    assert user.password and user.username in row and user.password not in row
    assert (token_id, expires_at) == (ApiToken.objects.get(user=user).pk, None)

    cached = authentication.token_by_key(token).user
    assert "password" in cached.get_deferred_fields()
    cached.first_name = "Alice"
    cached.save()
    user.refresh_from_db()
    assert (user.first_name, cached.password) == ("Alice", user.password)


def test_the_cache_holds_a_digest_of_the_key_never_the_key(token):
    authentication.token_by_key(token)
    assert token not in cache_key(token)
    raw = caches["default"]._cache.get_client(write=False)
    assert [k for k in raw.scan_iter(match=f"*{token}*")] == []


def test_a_deleted_token_is_refused_at_once(token):
    client = client_for(token)
    assert list_orders(client).status_code == 200
    delete_token(token)
    assert list_orders(client).status_code == 401


def test_a_deactivated_user_is_refused_at_once(token, user):
    client = client_for(token)
    assert list_orders(client).status_code == 200
    user.is_active = False
    user.save()
    response = list_orders(client)
    assert response.status_code == 401
    assert response.json() == {"detail": "User inactive or deleted."}


def test_a_deleted_user_is_refused_at_once(token, user):
    client = client_for(token)
    assert list_orders(client).status_code == 200
    user.delete()
    assert list_orders(client).status_code == 401


def test_a_change_to_the_user_is_seen_by_the_next_request(token, user):
    assert authentication.token_by_key(token).user.is_staff is False
    user.is_staff = True
    user.save()
    assert authentication.token_by_key(token).user.is_staff is True


def test_a_change_rolled_back_leaves_the_cache_right(token, user):
    from django.db import transaction

    authentication.token_by_key(token)
    with pytest.raises(RuntimeError), transaction.atomic():
        user.is_active = False
        user.save()
        raise RuntimeError("rolled back")
    assert authentication.token_by_key(token).user.is_active is True


def test_a_token_deleted_inside_a_transaction_is_forgotten_again_on_commit(token):
    from django.db import transaction

    cached = cache_key(token)
    with transaction.atomic():
        delete_token(token)
        # A request on another connection still sees the token until the commit, and caches it again.
        caches["default"].set(cached, ("stale",), timeout=30)
    assert caches["default"].get(cached) is None


def test_with_the_cache_off_every_request_reads_the_database(token, settings):
    settings.API_TOKEN_CACHE_SECONDS = 0
    client = client_for(token)
    assert len(token_queries(client)) == 1
    assert len(token_queries(client)) == 1
    assert caches["default"].get(cache_key(token)) is None


def test_with_the_cache_down_tokens_are_read_from_the_database_with_one_warning(token, settings, monkeypatch, caplog):
    default = settings.CACHES["default"]
    settings.CACHES = {"default": {**default, "LOCATION": f"redis://127.0.0.1:{free_port()}/0"}}
    monkeypatch.setattr(authentication.cache_down, "last_warning_at", -math.inf)
    client = client_for(token)

    with caplog.at_level(logging.WARNING, logger="accounts.authentication"):
        assert list_orders(client).status_code == 200
        assert list_orders(client).status_code == 200
        delete_token(token)  # the write succeeds with the cache down
        assert list_orders(client).status_code == 401

    warnings = [r for r in caplog.records if r.name == "accounts.authentication" and r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "token cache off" in warnings[0].getMessage()


def count_under(throttle, user_id) -> int | None:
    return caches["default"].get(throttle.user_window_key(user_id))


@pytest.fixture
def throttle(settings):
    from orders.apis import OrderThrottle

    settings.ORDERS_RATE_LIMIT = "100/minute"
    return OrderThrottle()


def test_a_server_new_to_the_script_costs_its_load_and_is_counted_as_one_round_trip(token, user, throttle, monkeypatch):
    """What a restarted Redis answers the first EVALSHA (NOSCRIPT): redis-py loads the script and sends it again."""
    redis = RedisCommands(monkeypatch)
    authentication.token_by_key_counted(token, throttle)
    # A digest the server does not know, so it answers NOSCRIPT as after a restart; flushing its scripts instead would
    # change what other test workers sharing the server see. redis-py puts the real digest back once it has loaded it.
    monkeypatch.setattr(throttling.CACHED_THEN_COUNT, "sha", "0" * 40)

    assert redis.during(lambda: authentication.token_by_key_counted(token, throttle)) == ["EVALSHA"]
    assert redis.sent == ["EVALSHA", "SCRIPT LOAD", "EVALSHA"]


def test_a_known_token_and_its_users_count_come_in_one_round_trip(token, user, throttle, monkeypatch):
    redis = RedisCommands(monkeypatch)

    first = redis.during(lambda: authentication.token_by_key_counted(token, throttle))
    counted = []
    second = redis.during(lambda: counted.extend(authentication.token_by_key_counted(token, throttle)))

    assert first == ["GET", "SET"]  # not known yet: looked up as ever, nothing counted (the caller's throttle counts)
    assert second == ["EVALSHA"]
    found, count, count_key = counted
    assert (found.id, found.user.pk, count) == (ApiToken.objects.get().id, user.pk, 1)
    assert count_key == throttle.user_window_key(user.pk)
    assert authentication.token_by_key_counted(token, throttle).count == 2
    assert count_under(throttle, user.pk) == 2


def test_a_known_token_not_cached_any_more_is_read_once_and_not_counted(token, user, throttle, monkeypatch):
    authentication.token_by_key(token)
    caches["default"].delete(cache_key(token))
    redis = RedisCommands(monkeypatch)

    with CaptureQueriesContext(connection) as queries:
        sent = redis.during(lambda: authentication.token_by_key_counted(token, throttle))

    assert sent == ["EVALSHA", "SET"]
    assert len(queries) == 1
    assert count_under(throttle, user.pk) is None


def test_a_refused_token_is_not_counted(token, user, throttle, monkeypatch):
    ApiToken.objects.update(expires_at=timezone.now() + timedelta(hours=1))
    authentication.token_by_key(token)  # known, cached with its expiry
    monkeypatch.setattr(authentication.timezone, "now", lambda: datetime.max.replace(tzinfo=UTC))

    with pytest.raises(AuthenticationFailed, match="expired"):
        authentication.TokenAuthentication().authenticate_credentials_counted(token, throttle)

    assert count_under(throttle, user.pk) == 0


def test_a_token_another_user_holds_now_is_counted_for_no_one_else(token, user, other_user, throttle, monkeypatch):
    authentication.token_by_key(token)
    # This process remembers the token as another user's (as if it had changed hands since): the cached row decides.
    monkeypatch.setitem(authentication._token_users, key_digest(token), other_user.pk)

    found, count, _ = authentication.token_by_key_counted(token, throttle)

    assert (found.user.pk, count) == (user.pk, None)
    assert count_under(throttle, other_user.pk) == 0
    assert authentication._token_users[key_digest(token)] == user.pk


def test_the_tokens_users_a_process_remembers_are_bounded(user, monkeypatch):
    monkeypatch.setattr(authentication, "TOKEN_USERS_KEPT", 2)
    monkeypatch.setattr(authentication, "_token_users", {})
    for _ in range(5):
        authentication.token_by_key(api_token_create(user=user)[1])

    assert 1 <= len(authentication._token_users) <= 2


def test_a_known_token_revoked_is_refused_and_not_counted(token, user, throttle):
    authentication.token_by_key(token)  # known to this process, cached
    delete_token(token)

    with pytest.raises(AuthenticationFailed, match="Invalid token"):
        authentication.TokenAuthentication().authenticate_credentials_counted(token, throttle)

    assert count_under(throttle, user.pk) is None
