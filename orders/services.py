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
from outbox.services import message_create


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
    try:
        with transaction.atomic(durable=True):
            with connection.cursor() as cursor:
                cursor.execute(ORDER_INSERT.sql, [user.pk, goods_name, total, transaction_id, db_now])
                order_id = cursor.lastrowid
            message_create(
                transaction_id=transaction_id,
                business=BUSINESS_ORDER,
                foreign_key=str(order_id),
                payload=order_message_payload(order_id=order_id, user_id=user.pk, total=total, created_at=now),
            )
            if idempotency_key is not None:
                with connection.cursor() as cursor:
                    cursor.execute(
                        IDEMPOTENCY_KEY_INSERT.sql, [user.pk, idempotency_key, fingerprint, order_id, db_now]
                    )
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
