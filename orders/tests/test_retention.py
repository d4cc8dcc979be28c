"""Idempotency keys expire: beat deletes keys past IDEMPOTENCY_KEY_RETENTION_HOURS in batches; orders stay."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from config.celery import app
from orders.models import IdempotencyKey, Order
from orders.services import idempotency_keys_purge, order_create
from orders.tasks import purge_idempotency_keys

# Orders commit in their own transaction, as in production: no test case's transaction may hold them.
pytestmark = pytest.mark.usefixtures("committed_db")


def keyed_orders(user, keys: list[str], *, age: timedelta) -> None:
    for key in keys:
        order_create(user=user, goods_name="tea", total=1, idempotency_key=key)
    IdempotencyKey.objects.filter(key__in=keys).update(created_at=timezone.now() - age)


def test_purge_deletes_only_old_keys_in_small_batches_and_keeps_the_orders(user):
    keyed_orders(user, ["old1", "old2", "old3"], age=timedelta(hours=25))
    keyed_orders(user, ["new1"], age=timedelta(hours=23))

    with CaptureQueriesContext(connection) as queries:
        deleted = idempotency_keys_purge(older_than=timezone.now() - timedelta(hours=24), batch_size=2)

    assert deleted == 3
    deletes = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("DELETE")]
    assert len(deletes) == 2  # 3 keys in batches of 2: short statements by primary key, never one unbounded DELETE
    assert list(IdempotencyKey.objects.values_list("key", flat=True)) == ["new1"]
    assert Order.objects.count() == 4


def test_a_retry_after_the_retention_places_a_new_order(user):
    first = order_create(user=user, goods_name="tea", total=1, idempotency_key="k").order
    assert not order_create(user=user, goods_name="tea", total=1, idempotency_key="k").created
    IdempotencyKey.objects.update(created_at=timezone.now() - timedelta(hours=settings.IDEMPOTENCY_KEY_RETENTION_HOURS))

    assert purge_idempotency_keys.apply().get() == 1
    again = order_create(user=user, goods_name="tea", total=1, idempotency_key="k")

    assert again.created and again.order.pk != first.pk


def test_beat_runs_the_idempotency_key_retention_on_the_outbox_queue():
    entry = app.conf.beat_schedule["orders-purge-idempotency-keys"]
    assert entry["task"] == "orders.purge_idempotency_keys"
    assert "orders.purge_idempotency_keys" in app.tasks
    assert app.amqp.router.route({}, "orders.purge_idempotency_keys")["queue"].name == "outbox"


def test_the_beat_task_purges_in_batches_of_the_configured_size_and_logs_how_many(user, settings, caplog):
    settings.OUTBOX_RETENTION_BATCH_SIZE = 2
    settings.IDEMPOTENCY_KEY_RETENTION_HOURS = 30
    keyed_orders(user, ["a", "b", "c"], age=timedelta(hours=31))

    with CaptureQueriesContext(connection) as queries, caplog.at_level("INFO", logger="orders.tasks"):
        assert purge_idempotency_keys.apply().get() == 3

    assert len([q for q in queries.captured_queries if q["sql"].startswith("DELETE")]) == 2
    assert "purged 3 idempotency keys older than 30 hours" in caplog.text
