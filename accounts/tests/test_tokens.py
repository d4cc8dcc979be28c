"""Hashed API tokens: no key at rest, expiry and revocation refused at once (cached or not), commands, admin, and
the data migration that hashed DRF's plain-text keys."""

import importlib
import io
import logging
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.apps import apps
from django.contrib import admin
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.authtoken.models import Token, TokenProxy

from accounts import authentication
from accounts.keys import KEY_MARK, KEY_PREFIX_LENGTH, key_digest, key_prefix
from accounts.models import ApiToken
from accounts.services import api_token_create
from accounts.tests.support import client_for
from core.errors import ApplicationError

pytestmark = pytest.mark.django_db(transaction=True)


def get_orders(key: str):
    return client_for(key).get("/api/orders/")


def command_output(*args, **options) -> list[str]:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO(), **options)
    return out.getvalue().splitlines()


def tables_holding(text: str) -> list[str]:
    """Return "table.column" for every text column of the order service's database that contains `text`."""
    qn = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = DATABASE()"
            " AND data_type IN ('char', 'varchar', 'text', 'mediumtext', 'longtext', 'json', 'blob', 'longblob')"
        )
        columns = cursor.fetchall()
        found = []
        for table, column in columns:
            cursor.execute(f"SELECT 1 FROM {qn(table)} WHERE INSTR({qn(column)}, %s) > 0 LIMIT 1", [text])  # noqa: S608
            if cursor.fetchone():
                found.append(f"{table}.{column}")
    return found


def test_the_database_holds_no_key_in_plain_text_after_a_token_is_created(user):
    key = command_output("create_api_token", user.username, "--name", "laptop")[-1]
    assert get_orders(key).status_code == 200  # the key works, and is now cached too
    assert tables_holding(key) == []
    assert tables_holding(key.removeprefix(KEY_MARK)[KEY_PREFIX_LENGTH:]) == []  # not even the secret part
    token = ApiToken.objects.get(user=user)
    assert (token.name, token.prefix, token.digest) == ("laptop", key_prefix(key), key_digest(key))
    assert tables_holding(token.digest) == ["api_tokens.digest"]  # the search finds what is there


def test_create_prints_the_key_last_with_the_expiry(user):
    lines = command_output("create_api_token", user.username, "--expires-days", "7")
    token = ApiToken.objects.get(user=user)
    assert timedelta(days=7) - timedelta(minutes=1) < token.expires_at - timezone.now() <= timedelta(days=7)
    assert f"expires {token.expires_at:%Y-%m-%d}" in lines[0]
    assert key_digest(lines[-1]) == token.digest and len(lines[-1]) >= 43


@pytest.mark.parametrize("days", ["0", "-1", "3651"])
def test_create_refuses_an_expiry_out_of_range(user, days):
    with pytest.raises(CommandError, match="--expires-days must be between 1 and 3650"):
        call_command("create_api_token", user.username, "--expires-days", days)
    assert not ApiToken.objects.exists()


def test_create_refuses_an_expiry_that_is_not_a_number(user):
    with pytest.raises(CommandError, match="invalid int value: 'soon'"):
        call_command("create_api_token", user.username, "--expires-days", "soon")
    assert not ApiToken.objects.exists()


@pytest.mark.parametrize("command", ["create_api_token", "revoke_api_tokens", "drf_create_token"])
def test_commands_refuse_an_unknown_user(db, command):
    with pytest.raises(CommandError, match="no user named 'nobody'"):
        call_command(command, "nobody")
    assert not ApiToken.objects.exists()


def test_a_name_too_long_is_refused(user):
    with pytest.raises(CommandError, match="at most 64 characters"):
        call_command("create_api_token", user.username, "--name", "x" * 65)
    with pytest.raises(ApplicationError):
        api_token_create(user=user, name="x" * 65)
    assert not ApiToken.objects.exists()


def test_a_revoked_key_is_refused_at_once_though_it_was_cached(user):
    _, laptop = api_token_create(user=user, name="laptop")
    _, ci = api_token_create(user=user, name="ci")
    assert get_orders(laptop).status_code == 200 and get_orders(ci).status_code == 200  # both cached

    assert command_output("revoke_api_tokens", user.username, "--name", "laptop") == ["revoked 1"]
    response = get_orders(laptop)
    assert (response.status_code, response.json()) == (401, {"detail": "Invalid token."})
    assert get_orders(ci).status_code == 200

    assert command_output("revoke_api_tokens", user.username) == ["revoked 1"]
    assert get_orders(ci).status_code == 401
    assert command_output("revoke_api_tokens", user.username) == ["revoked 0"]


def test_an_expired_key_is_refused_at_once_though_it_was_cached(user, monkeypatch):
    token, key = api_token_create(user=user, expires_at=timezone.now() + timedelta(hours=1))
    assert get_orders(key).status_code == 200  # cached, with its expiry
    assert caches_entry(key) is not None

    # The clock moves past the expiry (injected: no test waits an hour); the cached row still says "valid user".
    later = token.expires_at + timedelta(seconds=1)
    monkeypatch.setattr("accounts.authentication.timezone.now", lambda: later)
    with CaptureQueriesContext(connection) as ctx:
        response = get_orders(key)
    assert (response.status_code, response.json()) == (401, {"detail": "Token expired."})
    assert not [q for q in ctx.captured_queries if ApiToken._meta.db_table in q["sql"]]  # refused from the cache


def test_an_expired_key_is_refused_when_read_from_the_database(user, settings):
    settings.API_TOKEN_CACHE_SECONDS = 0
    _, key = api_token_create(user=user, expires_at=timezone.now() - timedelta(seconds=1))
    response = get_orders(key)
    assert (response.status_code, response.json()) == (401, {"detail": "Token expired."})


def caches_entry(key: str):
    from django.core.cache import caches

    return caches["default"].get(authentication.token_cache_key(key_digest(key)))


def test_a_key_sharing_its_prefix_with_another_finds_its_own_row(user, other_user, settings):
    settings.API_TOKEN_CACHE_SECONDS = 0
    _, key = api_token_create(user=user)
    # Another user's token whose key starts the same (one in 2^48 by chance, made here on purpose).
    twin = key_prefix(key) + "Z" * 35
    ApiToken.objects.create(user=other_user, prefix=key_prefix(key), digest=key_digest(twin))
    assert authentication.token_by_key(key).user == user
    assert authentication.token_by_key(twin).user == other_user
    assert authentication.token_by_key(key_prefix(key) + "Y" * 35) is None
    assert get_orders(key_prefix(key) + "Y" * 35).status_code == 401


@pytest.mark.parametrize("cache_seconds", [0, 30])
@pytest.mark.parametrize("old_key", ["-" + "a" * 42, "cs_" + "b" * 40, "0123456789abcdef0123456789abcdef01234567"])
def test_a_key_made_before_the_mark_keeps_working(user, settings, old_key, cache_seconds):
    settings.API_TOKEN_CACHE_SECONDS = cache_seconds
    # Stored as it was before the mark: its first characters, even when they happen to be the mark.
    ApiToken.objects.create(user=user, prefix=old_key[:KEY_PREFIX_LENGTH], digest=key_digest(old_key))
    assert authentication.token_by_key(old_key).user == user
    assert get_orders(old_key).status_code == 200
    assert get_orders(old_key).status_code == 200  # and again, from the cache when there is one


def test_a_new_key_is_stored_with_the_characters_after_the_mark(user, settings):
    settings.API_TOKEN_CACHE_SECONDS = 0
    token, key = api_token_create(user=user)
    assert key.startswith(KEY_MARK)
    assert token.prefix == key[len(KEY_MARK) : len(KEY_MARK) + KEY_PREFIX_LENGTH]
    assert authentication.token_by_key(key).user == user
    assert get_orders(key).status_code == 200


def test_drf_create_token_makes_a_hashed_token_in_drf_s_output_shape(user):
    first = command_output("drf_create_token", user.username)[-1].split()
    assert first[:2] == ["Generated", "token"] and first[3:] == ["for", "user", user.username]
    assert get_orders(first[2]).status_code == 200
    assert not Token.objects.exists()  # no plain-text row
    assert tables_holding(first[2]) == []

    second = command_output("drf_create_token", user.username, "-r")[-1].split()[2]
    assert get_orders(first[2]).status_code == 401  # -r revoked the earlier one
    assert get_orders(second).status_code == 200


def hash_authtoken_keys():
    migration = importlib.import_module("accounts.migrations.0002_hash_authtoken_keys")
    migration.hash_authtoken_keys(apps, SimpleNamespace(connection=connection))


def test_the_data_migration_hashes_drf_keys_so_they_keep_working(user, other_user):
    old = [Token.objects.create(user=user).key, Token.objects.create(user=other_user).key]
    assert [get_orders(key).status_code for key in old] == [401, 401]  # not hashed yet: plain keys are not read

    hash_authtoken_keys()
    hash_authtoken_keys()  # again: the keys already hashed are skipped

    assert ApiToken.objects.count() == 2
    assert [get_orders(key).status_code for key in old] == [200, 200]
    migrated = ApiToken.objects.get(user=user)
    assert (migrated.name, migrated.prefix, migrated.expires_at) == ("drf authtoken", old[0][:8], None)
    call_command("revoke_api_tokens", user.username, stdout=io.StringIO())
    assert get_orders(old[0]).status_code == 401


def test_staff_see_tokens_in_the_admin_never_a_key_and_revoke_them(user, make_staff_client, caplog):
    token, key = api_token_create(user=user, name="laptop")
    assert get_orders(key).status_code == 200
    staff = make_staff_client("auditor", "accounts.view_apitoken", "accounts.delete_apitoken")
    url = "/admin/accounts/apitoken/"

    page = staff.get(url).content.decode()
    assert "laptop" in page and f"{key_prefix(key)}…" in page
    assert key not in page and key_digest(key) not in page
    detail = staff.get(f"{url}{ApiToken.objects.get().pk}/change/").content.decode()
    assert key_prefix(key) in detail and key_digest(key) not in detail

    with caplog.at_level(logging.INFO, logger="accounts.services"):
        done = staff.post(url, {"action": "revoke", "_selected_action": [token.pk]}, follow=True)
    assert "Revoked 1 token(s)" in done.content.decode()
    assert get_orders(key).status_code == 401
    assert f"API tokens [{token.pk}] revoked by auditor" in caplog.text


def test_staff_without_the_delete_permission_cannot_revoke(user, make_staff_client):
    token, _ = api_token_create(user=user)
    viewer = make_staff_client("viewer", "accounts.view_apitoken")
    response = viewer.post("/admin/accounts/apitoken/", {"action": "revoke", "_selected_action": [token.pk]})
    assert response.status_code in (200, 302)
    assert ApiToken.objects.filter(pk=token.pk).exists()


def test_drf_s_admin_page_of_plain_keys_is_gone():
    assert not admin.site.is_registered(TokenProxy)
    assert admin.site.is_registered(ApiToken)


def test_the_look_up_reads_the_user_and_the_token_as_the_orm_does(user, settings):
    """The plain SQL and its converters (accounts/authentication.py) drift from the models: this fails."""
    settings.API_TOKEN_CACHE_SECONDS = 0
    user.last_login = timezone.now()
    user.save()
    token, key = api_token_create(user=user, expires_at=timezone.now() + timedelta(days=1))
    found = authentication.token_by_key(key)
    token.refresh_from_db()
    user.refresh_from_db()
    fields = [field.attname for field in type(user)._meta.concrete_fields]
    assert [getattr(found.user, f) for f in fields] == [getattr(user, f) for f in fields]
    assert found.user.get_deferred_fields() == set() and found.user._state.adding is False
    assert (found.id, found.expires_at) == (token.pk, token.expires_at)
    assert found.expires_at.tzinfo is not None and found.user.is_active is True
