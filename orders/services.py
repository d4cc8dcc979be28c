"""Writes for orders: placing an order together with its outbox message and idempotency record."""

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth.models import AbstractBaseUser
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connections
from django.utils import timezone

from core import sql_batches
from core.contract import BUSINESS_ORDER
from core.errors import ApplicationError
from core.logs import transaction_bind
from core.retention import purge_in_batches
from orders.messages import order_message_payload
from orders.models import IdempotencyKey, Order
from orders.statements import IDEMPOTENCY_KEY_INSERT, MESSAGE_AFTER_ORDER, ORDER_INSERT, PENDING_ORDER_ID, order_batch
from outbox.ids import new_transaction_id
from outbox.services import message_row, wake_relay


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

    def parameters(self) -> list:
        """Return the batch's parameters, statement after statement."""
        payload = order_message_payload(
            order_id=PENDING_ORDER_ID, user_id=self.user_id, total=self.total, created_at=self.created_at
        )
        _, message = message_row(
            transaction_id=self.transaction_id, business=BUSINESS_ORDER, foreign_key="", payload=payload
        )
        parameters = [self.user_id, self.goods_name, self.total, self.transaction_id, self.db_now]
        parameters += MESSAGE_AFTER_ORDER.parameters(message)
        if self.idempotency_key is not None:
            parameters += IDEMPOTENCY_KEY_INSERT.parameters(
                [self.user_id, self.idempotency_key, self.fingerprint, None, self.db_now]
            )
        return parameters


def _order_rows_commit(connection, rows: OrderRows) -> int:
    """Write the rows in one explicit transaction, START TRANSACTION ... COMMIT, and return the order id.

    Django's atomic sends SET autocommit=0 before the statements and SET autocommit=1 after the COMMIT; START
    TRANSACTION alone opens the transaction, and the whole transaction is one batch (on a Galera node, one statement
    per round trip: core/sql.Transaction). MariaDB stops a batch at its
    first failing statement with the transaction still open: any error rolls everything back before it propagates;
    when even the ROLLBACK fails the connection is closed, and the server discards what it held.
    """
    batch = order_batch(idempotency_key=rows.idempotency_key is not None)
    try:
        # On the backend's own cursor (core/sql_batches.batch_insert_ids), as the award's: Django's cursor wrapper,
        # its execute wrapper and a nextset() per result are work on every order that reads nothing the batch returns.
        keys = sql_batches.batch_insert_ids(connection, batch, rows.parameters())
    except BaseException:
        sql_batches.transaction_abandon(connection)
        raise
    # The order's INSERT is the batch's first statement after START TRANSACTION.
    return keys[1]


def order_create(
    *, user: AbstractBaseUser, goods_name: str, total: int, idempotency_key: str | None = None
) -> OrderPlacement:
    """Place an order: the order, its transaction_log row and the idempotency record commit together or not at all.

    A repeated idempotency key returns the order it first produced. The UNIQUE (user, key) index decides races:
    a concurrent duplicate blocks on the index until the first commits, then fails and reads the winner.
    """
    # The connection itself, not django.db.connection: each attribute read through that proxy looks the connection up
    # again, and the order's path reads many.
    connection = connections[DEFAULT_DB_ALIAS]
    if connection.in_atomic_block:
        # The order commits in a transaction of its own, and the relay is woken once it has: nesting it in a caller's
        # would acknowledge an order that the caller may still roll back.
        raise RuntimeError("order_create commits the order in its own transaction; call it outside a transaction")
    fingerprint = request_fingerprint(goods_name=goods_name, total=total)
    transaction_id = new_transaction_id()
    transaction_bind(transaction_id)
    now = timezone.now()
    db_now = connection.ops.adapt_datetimefield_value(now)
    rows = OrderRows(user.pk, goods_name, total, transaction_id, now, db_now, idempotency_key, fingerprint)
    try:
        order_id = _order_rows_commit(connection, rows)
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
    wake_relay()
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
