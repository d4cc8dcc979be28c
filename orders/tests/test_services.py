"""order_create: atomicity with its outbox row, idempotency, and the concurrent same-key race."""

import threading
from unittest import mock

import pytest
from django.db import IntegrityError, connection, transaction

from orders.models import IdempotencyKey, Order
from orders.services import IdempotencyKeyReused, order_create
from outbox.models import TransactionLog


@pytest.mark.django_db
def test_order_create_writes_order_and_its_message(user):
    placement = order_create(user=user, goods_name="book", total=3)

    order = placement.order
    assert placement.created
    message = TransactionLog.objects.get(pk=order.transaction_id)
    assert (message.business, message.foreign_key) == ("order", str(order.pk))
    assert message.status == TransactionLog.Status.PENDING
    assert message.payload == {
        "schema_version": 1,
        "transaction_id": order.transaction_id,
        "order_id": order.pk,
        "user_id": user.pk,
        "total": 3,
    }
    assert len(order.transaction_id) == 32


@pytest.mark.django_db(transaction=True)
def test_failing_log_write_leaves_no_order(user):
    with (
        mock.patch("outbox.services.TransactionLog.objects.create", side_effect=IntegrityError("injected")),
        pytest.raises(IntegrityError),
    ):
        order_create(user=user, goods_name="book", total=3, idempotency_key="k")

    assert Order.objects.count() == 0
    assert TransactionLog.objects.count() == 0
    assert IdempotencyKey.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_failing_idempotency_write_leaves_no_order_and_no_message(user):
    with (
        mock.patch("orders.services.IdempotencyKey.objects.create", side_effect=RuntimeError("injected")),
        pytest.raises(RuntimeError),
    ):
        order_create(user=user, goods_name="book", total=3, idempotency_key="k")

    assert Order.objects.count() == 0
    assert TransactionLog.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_order_create_refuses_to_nest_in_an_outer_transaction(user):
    with transaction.atomic(), pytest.raises(RuntimeError, match="durable"):
        order_create(user=user, goods_name="book", total=3)


@pytest.mark.django_db
def test_same_key_same_body_returns_the_first_order(user):
    first = order_create(user=user, goods_name="book", total=3, idempotency_key="key-1")
    again = order_create(user=user, goods_name="book", total=3, idempotency_key="key-1")

    assert again.order.pk == first.order.pk
    assert not again.created
    assert Order.objects.count() == 1
    assert TransactionLog.objects.count() == 1


@pytest.mark.django_db
def test_same_key_different_body_is_refused(user):
    first = order_create(user=user, goods_name="book", total=3, idempotency_key="key-1")

    with pytest.raises(IdempotencyKeyReused) as excinfo:
        order_create(user=user, goods_name="book", total=4, idempotency_key="key-1")

    assert excinfo.value.extra == {"order_id": first.order.pk}
    assert Order.objects.count() == 1


@pytest.mark.django_db
def test_keys_are_per_user_and_case_sensitive(user, other_user):
    a = order_create(user=user, goods_name="book", total=3, idempotency_key="Key")
    b = order_create(user=other_user, goods_name="book", total=3, idempotency_key="Key")
    c = order_create(user=user, goods_name="book", total=3, idempotency_key="key")
    d = order_create(user=user, goods_name="book", total=3, idempotency_key="Key ")

    assert len({a.order.pk, b.order.pk, c.order.pk, d.order.pk}) == 4


@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_with_one_key_make_exactly_one_order(user):
    threads_count = 8
    barrier = threading.Barrier(threads_count)
    results, errors = [], []

    def place():
        try:
            barrier.wait()
            results.append(order_create(user=user, goods_name="book", total=3, idempotency_key="race"))
        except Exception as exc:  # collected and asserted below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=place) for _ in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert errors == []
    assert len(results) == threads_count
    assert len({r.order.pk for r in results}) == 1
    assert sum(r.created for r in results) == 1
    assert Order.objects.count() == 1
    assert TransactionLog.objects.count() == 1
