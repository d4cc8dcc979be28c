"""Writes for orders: placing an order together with its outbox message and idempotency record."""

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from core import sql
from core.contract import BUSINESS_ORDER
from core.errors import ApplicationError
from core.logs import transaction_bind
from core.retention import purge_in_batches
from orders.messages import order_message_payload
from orders.models import IdempotencyKey, Order
from outbox.ids import new_transaction_id
from outbox.services import message_insert, wake_relay


class IdempotencyKeyReused(ApplicationError):
    status = 422


@dataclass(frozen=True)
class OrderPlacement:
    order: Order
    created: bool


def request_fingerprint(*, goods_name: str, total: int) -> str:
    """Return a stable digest of the validated order fields, to tell a retry from a different request."""
    canonical = json.dumps({"goods_name": goods_name, "total": total}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


# The order request is the API's hot path, so its inserts are plain SQL built from the models (core/sql.py says
# why, with the measurement); test_services reads the rows back through the ORM.
ORDER_INSERT = sql.Insert(Order, ("user", "goods_name", "total", "transaction_id", "created_at"))
IDEMPOTENCY_KEY_INSERT = sql.Insert(IdempotencyKey, ("user", "key", "fingerprint", "order", "created_at"))


@dataclass(frozen=True)
class OrderRows:
    user_id: int
    goods_name: str
    total: int
    transaction_id: str
    created_at: datetime
    db_now: object
    idempotency_key: str | None
    fingerprint: str


def _order_rows_insert(rows: OrderRows) -> int:
    """Insert the order, its outbox row and its idempotency record in the open transaction; return the order id."""
    with connection.cursor() as cursor:
        cursor.execute(ORDER_INSERT.sql, [rows.user_id, rows.goods_name, rows.total, rows.transaction_id, rows.db_now])
        order_id = cursor.lastrowid
    message_insert(
        transaction_id=rows.transaction_id,
        business=BUSINESS_ORDER,
        foreign_key=str(order_id),
        payload=order_message_payload(
            order_id=order_id, user_id=rows.user_id, total=rows.total, created_at=rows.created_at
        ),
    )
    if rows.idempotency_key is not None:
        with connection.cursor() as cursor:
            cursor.execute(
                IDEMPOTENCY_KEY_INSERT.sql,
                [rows.user_id, rows.idempotency_key, rows.fingerprint, order_id, rows.db_now],
            )
    return order_id


def _order_rows_commit(rows: OrderRows) -> int:
    """Write the rows in one explicit transaction, START TRANSACTION ... COMMIT, and return the order id.

    Django's atomic sends SET autocommit=0 before the statements and SET autocommit=1 after the COMMIT; START
    TRANSACTION alone opens the transaction, one round trip to MariaDB fewer per order. Any error rolls everything
    back before it propagates; when even the ROLLBACK fails the connection is closed, and the server discards what
    it held.
    """
    rollback_failed = False
    try:
        with connection.cursor() as cursor:
            cursor.execute("START TRANSACTION")
            try:
                order_id = _order_rows_insert(rows)
                cursor.execute("COMMIT")
            except BaseException:
                try:
                    cursor.execute("ROLLBACK")
                except Exception:
                    rollback_failed = True
                raise
    finally:
        if rollback_failed:
            connection.close()
    return order_id


def order_create(
    *, user: AbstractBaseUser, goods_name: str, total: int, idempotency_key: str | None = None
) -> OrderPlacement:
    """Place an order: the order, its transaction_log row and the idempotency record commit together or not at all.

    A repeated idempotency key returns the order it first produced. The UNIQUE (user, key) index decides races:
    a concurrent duplicate blocks on the index until the first commits, then fails and reads the winner.
    """
    fingerprint = request_fingerprint(goods_name=goods_name, total=total)
    transaction_id = new_transaction_id()
    transaction_bind(transaction_id)
    now = timezone.now()
    db_now = connection.ops.adapt_datetimefield_value(now)
    rows = OrderRows(user.pk, goods_name, total, transaction_id, now, db_now, idempotency_key, fingerprint)
    try:
        if connection.in_atomic_block:
            # Only a test case's transaction may hold us (durable=True refuses any other); the ORM nests in it.
            with transaction.atomic(durable=True):
                order_id = _order_rows_insert(rows)
                transaction.on_commit(wake_relay, robust=True)
        else:
            order_id = _order_rows_commit(rows)
            wake_relay()
    except IntegrityError:
        if idempotency_key is None:
            raise
        record = IdempotencyKey.objects.select_related("order").filter(user=user, key=idempotency_key).first()
        if record is None:
            raise
        if record.fingerprint != fingerprint:
            raise IdempotencyKeyReused(
                "This Idempotency-Key was already used with a different request body.",
                extra={"order_id": record.order_id},
            ) from None
        return OrderPlacement(order=record.order, created=False)
    order = ORDER_INSERT.instance(connection.alias, [user.pk, goods_name, total, transaction_id, now], pk=order_id)
    order.user = user  # the caller's user, so order.user costs no query
    return OrderPlacement(order=order, created=True)


def idempotency_keys_purge(*, older_than: datetime, batch_size: int, max_batches: int | None = None) -> int:
    """Delete idempotency keys created before `older_than`, `batch_size` rows per statement; return how many.

    The orders stay: a retry with a purged key is a new request and places a new order. Each batch is its own short
    autocommit DELETE by primary key, so order inserts never wait behind a long purge.
    """
    return purge_in_batches(
        IdempotencyKey.objects.filter(created_at__lt=older_than),
        order_by="created_at",
        batch_size=batch_size,
        max_batches=max_batches,
    )
