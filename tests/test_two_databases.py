"""Two services, two databases: each holds only its own tables, reads never join across, and one may be down."""

import contextlib
import subprocess
import sys
import textwrap

import MySQLdb
import pytest
from django.conf import settings
from django.db import connections
from django.test.utils import CaptureQueriesContext

from credits import services as credits_services
from credits.models import DeadLetter
from credits.tests.support import place_order
from testkit.processes import database_address, database_url, free_port, service_env

ORDER_SERVICE_TABLES = {"orders", "transaction_log", "idempotency_keys", "auth_user"}
CREDITS_SERVICE_TABLES = {"order_credits", "credit_balances", "credit_dead_letters"}


def tables(alias: str) -> set[str]:
    with connections[alias].cursor() as cursor:
        cursor.execute("SHOW TABLES")
        return {row[0] for row in cursor.fetchall()}


def award(payload: dict) -> None:
    credits_services.credit_award(
        transaction_id=payload["transaction_id"],
        order_id=payload["order_id"],
        user_id=payload["user_id"],
        total=payload["total"],
    )


@contextlib.contextmanager
def credits_database_down():
    """Point the credits alias at a port nothing listens on, as a stopped server looks to a client."""
    closed_port = free_port()
    credits = connections["credits"]
    saved = credits.settings_dict["PORT"]
    credits.close()
    credits.settings_dict["PORT"] = closed_port
    try:
        yield
    finally:
        credits.close()
        credits.settings_dict["PORT"] = saved


def test_each_database_holds_only_its_own_service_tables(db):
    orders_side, credits_side = tables("default"), tables("credits")
    assert orders_side >= ORDER_SERVICE_TABLES and not CREDITS_SERVICE_TABLES & orders_side
    assert credits_side >= CREDITS_SERVICE_TABLES and not ORDER_SERVICE_TABLES & credits_side


@pytest.mark.usefixtures("committed_db")  # the orders commit in their own transaction
def test_the_orders_page_asks_the_credits_database_once_whatever_its_size(api, user):
    payloads = [place_order(user=user, total=n)[1] for n in range(1, 8)]
    award(payloads[0])
    with CaptureQueriesContext(connections["credits"]) as credits_side:
        response = api.get("/api/orders/?limit=5")
    assert response.status_code == 200
    assert [order["credit_status"] for order in response.json()["results"]] == ["pending"] * 5
    assert len(credits_side.captured_queries) == 1
    last_page = api.get("/api/orders/?limit=5&offset=5").json()["results"]
    assert [order["credit_status"] for order in last_page] == ["pending", "awarded"]


@pytest.mark.usefixtures("committed_db")  # the order commits in its own transaction
def test_an_awarded_order_with_an_open_dead_letter_for_another_copy_shows_awarded(api, user):
    order_id, payload = place_order(user=user)
    award(payload)
    DeadLetter.objects.create(
        message_id="another-copy",
        order_id=order_id,
        payload=payload,
        reason=DeadLetter.Reason.UNEXPECTED,
        error="x",
        attempts=1,
        first_failed_at="2026-01-01T00:00:00Z",
        last_failed_at="2026-01-01T00:00:00Z",
    )
    assert api.get(f"/api/orders/{order_id}/").json()["credit_status"] == "awarded"


@pytest.mark.django_db(transaction=True)
def test_with_the_credits_database_down_orders_are_taken_and_read_with_credit_status_unknown(api, user, caplog):
    order_id, _ = place_order(user=user)
    with credits_database_down():
        placed = api.post("/api/orders/", {"goods_name": "tea", "total": 2}, format="json")
        listed = api.get("/api/orders/")
        one = api.get(f"/api/orders/{order_id}/")
        credits = api.get("/api/credits/")
        health = api.get("/healthz")
    assert placed.status_code == 201 and placed.json()["credit_status"] == "pending"
    assert listed.status_code == 200
    assert {order["credit_status"] for order in listed.json()["results"]} == {"unknown"}
    assert one.status_code == 200 and one.json()["credit_status"] == "unknown"
    assert any("credits database did not answer" in r.getMessage() for r in caplog.records)
    # The credits API has nothing to answer with: a clear, retryable refusal rather than a 500.
    assert credits.status_code == 503 and credits["Retry-After"]
    assert "not answering" in credits.json()["detail"]
    # Orders are still taken, so the web stays in service; the probe names what is down.
    assert health.status_code == 200
    assert health.json()["checks"]["credits_database"] != "ok"
    assert api.get(f"/api/orders/{order_id}/").json()["credit_status"] != "unknown", "known again once it is back"


SMALL_INSTALL_FLOW = textwrap.dedent(
    """
    import django
    django.setup()
    from django.contrib.auth import get_user_model
    from django.db import connections
    from credits.services import credit_award
    from credits.selectors import credit_balance
    from orders.selectors import order_get
    from orders.services import order_create
    from outbox.models import TransactionLog

    assert connections["default"].settings_dict["NAME"] == connections["credits"].settings_dict["NAME"]
    user = get_user_model().objects.create_user(username="small")
    order = order_create(user=user, goods_name="tea", total=4).order
    payload = TransactionLog.objects.get(pk=order.transaction_id).payload
    credit_award(transaction_id=payload["transaction_id"], order_id=payload["order_id"],
                 user_id=payload["user_id"], total=payload["total"])
    assert order_get(user=user, order_id=order.pk).credit_status == "awarded"
    assert credit_balance(user_id=user.pk) == 8
    print("small install ok")
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("first", ["default", "credits"])
def test_a_small_install_with_both_urls_on_one_database_migrates_and_works(db, first):
    """Whichever alias migrates first, one database ends up with every table, and an order is credited in it."""
    default = connections["default"].settings_dict
    name = f"{default['NAME']}_single_{first}"
    host, port = database_address()
    server = MySQLdb.connect(host=host, port=port, user="root")
    server.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
    server.cursor().execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci")
    url = database_url(name=name)
    env = service_env(DATABASE_URL=url, CREDITS_DATABASE_URL=url)
    try:
        second = "default" if first == "credits" else "credits"
        for alias in (first, second):
            subprocess.run(
                [sys.executable, "manage.py", "migrate", "--database", alias, "--no-input", "-v", "0"],
                cwd=settings.BASE_DIR,
                env=env,
                check=True,
                timeout=300,
            )
        run = subprocess.run(
            [sys.executable, "-c", SMALL_INSTALL_FLOW],
            cwd=settings.BASE_DIR,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        assert "small install ok" in run.stdout
        cursor = server.cursor()
        cursor.execute(f"SHOW TABLES FROM `{name}`")
        assert {row[0] for row in cursor.fetchall()} >= ORDER_SERVICE_TABLES | CREDITS_SERVICE_TABLES
    finally:
        server.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
        server.close()


def test_no_credits_model_has_a_database_default():
    """An ORM insert of a model with a db_default asks the *default* connection about RETURNING (Django's
    Field.db_returning), so a credits worker confined to its own database could not record a dead letter."""
    from django.apps import apps

    defaulted = [
        f"{model.__name__}.{field.name}"
        for model in apps.get_app_config("credits").get_models()
        for field in model._meta.concrete_fields
        if field.has_db_default()
    ]
    assert defaulted == []
