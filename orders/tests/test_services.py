"""order_create: atomicity with its outbox row, idempotency, and the concurrent same-key race."""

import threading
from contextlib import contextmanager

import pytest
from django.db import OperationalError, connection, transaction

from orders.models import IdempotencyKey, Order
from orders.services import IdempotencyKeyReused, order_create, request_fingerprint
from outbox.models import TransactionLog
from testkit.db_faults import rollback_refused
from testkit.round_trips import round_trips, statement_heads

# The order commits in its own transaction, as in production: no test case's transaction may hold it.
pytestmark = pytest.mark.usefixtures("committed_db")


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


def test_the_rows_written_read_back_through_the_orm_as_the_returned_objects(user):
    placement = order_create(user=user, goods_name="Grüner Tee ☕", total=10_000, idempotency_key="Key-1 ")

    returned = placement.order
    stored = Order.objects.get(pk=returned.pk)
    fields = [field.attname for field in Order._meta.concrete_fields]
    assert [getattr(stored, f) for f in fields] == [getattr(returned, f) for f in fields]
    assert stored.created_at.tzinfo is not None
    assert (returned._state.adding, returned._state.db) == (False, stored._state.db)
    assert returned.user is user
    message = TransactionLog.objects.get(pk=returned.transaction_id)
    assert (message.status, message.attempts, message.published_at, message.last_error) == ("pending", 0, None, "")
    assert message.created_at == message.next_attempt_at >= stored.created_at
    assert (message.discarded_reason, message.discarded_by) == ("", "")
    key = IdempotencyKey.objects.get(order=stored)
    assert (key.user_id, key.key, key.created_at) == (user.pk, "Key-1 ", stored.created_at)
    assert key.fingerprint == request_fingerprint(goods_name="Grüner Tee ☕", total=10_000)


@contextmanager
def insert_refused(table: str):
    """Make the database itself refuse every INSERT into `table` (a trigger raising SQLSTATE 45000)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TRIGGER order_test_fault BEFORE INSERT ON {table} FOR EACH ROW"
            " SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'injected fault'"
        )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER IF EXISTS order_test_fault")


@pytest.mark.parametrize("table", ["orders", "transaction_log", "idempotency_keys"])
def test_any_failing_write_leaves_nothing_and_a_retry_with_the_key_succeeds(user, table):
    with insert_refused(table), pytest.raises(OperationalError, match="injected fault"):
        order_create(user=user, goods_name="book", total=3, idempotency_key="k")
    assert Order.objects.count() == TransactionLog.objects.count() == IdempotencyKey.objects.count() == 0

    placement = order_create(user=user, goods_name="book", total=3, idempotency_key="k")
    assert placement.created
    assert Order.objects.get().pk == placement.order.pk
    assert TransactionLog.objects.get().foreign_key == str(placement.order.pk)


def test_order_create_refuses_to_run_inside_a_transaction_and_writes_nothing(user):
    with transaction.atomic(), pytest.raises(RuntimeError, match="outside a transaction"):
        order_create(user=user, goods_name="book", total=3)
    assert Order.objects.count() == TransactionLog.objects.count() == 0


def test_same_key_same_body_returns_the_first_order(user):
    first = order_create(user=user, goods_name="book", total=3, idempotency_key="key-1")
    again = order_create(user=user, goods_name="book", total=3, idempotency_key="key-1")

    assert again.order.pk == first.order.pk
    assert not again.created
    assert Order.objects.count() == 1
    assert TransactionLog.objects.count() == 1


def test_same_key_different_body_is_refused(user):
    first = order_create(user=user, goods_name="book", total=3, idempotency_key="key-1")

    with pytest.raises(IdempotencyKeyReused) as excinfo:
        order_create(user=user, goods_name="book", total=4, idempotency_key="key-1")

    assert excinfo.value.extra == {"order_id": first.order.pk}
    assert Order.objects.count() == 1


def test_keys_are_per_user_and_case_sensitive(user, other_user):
    a = order_create(user=user, goods_name="book", total=3, idempotency_key="Key")
    b = order_create(user=other_user, goods_name="book", total=3, idempotency_key="Key")
    c = order_create(user=user, goods_name="book", total=3, idempotency_key="key")
    d = order_create(user=user, goods_name="book", total=3, idempotency_key="Key ")

    assert len({a.order.pk, b.order.pk, c.order.pk, d.order.pk}) == 4


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


def test_the_order_transaction_is_one_batch_without_autocommit_toggling(user):
    order_create(user=user, goods_name="warm-up", total=1)  # the connection opened, its settings sent
    with round_trips(connection) as sent:
        order_create(user=user, goods_name="book", total=3, idempotency_key="k")

    assert len(sent) == 1  # one round trip
    assert statement_heads(sent[0]) == [
        "START",
        "INSERT INTO `orders`",
        "SET",
        "INSERT INTO `transaction_log`",
        "INSERT INTO `idempotency_keys`",
        "COMMIT",
    ]
    assert connection.get_autocommit()


def fail_after_the_order(monkeypatch):
    """Make the server fail the order's batch right after the order's INSERT (a SIGNAL statement in between)."""
    from orders import services, statements

    real = services.order_batch

    def order_batch(**kwargs):
        head, sep, tail = real(**kwargs).sql.partition(f"SET {statements.ORDER_ID}")
        return f"{head}SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'injected after the order';\n{sep}{tail}"

    monkeypatch.setattr(services, "order_batch", order_batch)


@pytest.mark.parametrize("idempotency_key", ["k", None])
def test_a_failure_between_the_statements_rolls_the_whole_order_back(user, monkeypatch, idempotency_key):
    fail_after_the_order(monkeypatch)
    with pytest.raises(OperationalError, match="injected after the order"):
        order_create(user=user, goods_name="book", total=3, idempotency_key=idempotency_key)
    monkeypatch.undo()

    assert Order.objects.count() == TransactionLog.objects.count() == IdempotencyKey.objects.count() == 0
    # The connection is back in autocommit with nothing open: the next order commits on its own.
    placement = order_create(user=user, goods_name="book", total=3, idempotency_key=idempotency_key)
    connection.close()
    assert Order.objects.get().pk == placement.order.pk


def test_when_even_the_rollback_fails_the_connection_is_dropped_and_nothing_stays(user, monkeypatch):
    fail_after_the_order(monkeypatch)
    rollback_refused(monkeypatch, connection)
    with pytest.raises(OperationalError, match="injected after the order"):
        order_create(user=user, goods_name="book", total=3)
    monkeypatch.undo()

    assert connection.connection is None  # closed: the server rolled back what the session held
    assert Order.objects.count() == TransactionLog.objects.count() == 0


def test_the_relay_is_woken_only_after_the_commit(user, monkeypatch):
    from orders import services

    seen = []

    def wake_relay():
        # Read on a connection of its own: what a relay would see at the moment of the wake-up.
        import MySQLdb

        db = connection.settings_dict
        other = MySQLdb.connect(
            host=db["HOST"], port=int(db["PORT"] or 3306), user=db["USER"], password=db["PASSWORD"], database=db["NAME"]
        )
        cursor = other.cursor()
        cursor.execute("SELECT COUNT(*) FROM transaction_log")
        seen.append(cursor.fetchone()[0])
        other.close()

    monkeypatch.setattr(services, "wake_relay", wake_relay)
    order_create(user=user, goods_name="book", total=3)
    assert seen == [1]
