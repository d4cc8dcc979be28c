"""Writes for orders: placing an order together with its outbox message and idempotency record."""

import hashlib
import json
from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction

from config.errors import ApplicationError
from orders.models import IdempotencyKey, Order
from outbox.ids import new_transaction_id
from outbox.services import message_create

BUSINESS_ORDER = "order"


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


def order_create(
    *, user: AbstractBaseUser, goods_name: str, total: int, idempotency_key: str | None = None
) -> OrderPlacement:
    """Place an order: the order, its transaction_log row and the idempotency record commit together or not at all.

    A repeated idempotency key returns the order it first produced. The UNIQUE (user, key) index decides races:
    a concurrent duplicate blocks on the index until the first commits, then fails and reads the winner.
    """
    fingerprint = request_fingerprint(goods_name=goods_name, total=total)
    try:
        with transaction.atomic(durable=True):
            order = Order.objects.create(
                user=user, goods_name=goods_name, total=total, transaction_id=new_transaction_id()
            )
            message_create(
                transaction_id=order.transaction_id,
                business=BUSINESS_ORDER,
                foreign_key=str(order.pk),
                payload={"order_id": order.pk, "user_id": user.pk, "total": total},
            )
            if idempotency_key is not None:
                IdempotencyKey.objects.create(user=user, key=idempotency_key, fingerprint=fingerprint, order=order)
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
    return OrderPlacement(order=order, created=True)
