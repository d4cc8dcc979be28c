"""Making missing credits and stuck outbox rows whole through the outbox, never by awarding credits directly.

A repair only makes messages due again (or writes the one an order never got); the relay publishes them and the
consumer awards, so its idempotency (UNIQUE order_id) makes a repair of something that healed meanwhile a no-op.
A repair reads the credits database (was the order credited since the check?) and writes only the order service's
database, through its outbox: the message stays the only thing that crosses to the credits side.
"""

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from django.db import IntegrityError, transaction

from core import tracing
from core.contract import BUSINESS_ORDER
from credits.models import OrderCredit
from orders.messages import order_message_payload
from orders.models import Order
from outbox.models import TransactionLog
from outbox.selectors import message_trace_contexts
from outbox.services import message_create, messages_retry_now


@dataclass
class RepairResult:
    # Transaction ids of existing outbox rows made due now, and of messages written for orders that had none.
    reset: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    # What was left alone and why, keyed by order id or transaction id.
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def reenqueued(self) -> int:
        return len(self.reset) + len(self.created)

    def as_dict(self) -> dict:
        return {**asdict(self), "reenqueued": self.reenqueued}


def repair(*, missing_credit_order_ids: Iterable[int], stuck_log_ids: Iterable[str]) -> RepairResult:
    """Re-enqueue the messages behind missing credits and stuck outbox rows, judged on the database as it is now.

    The checks saw a snapshot; anything credited or published since is skipped, not re-sent.
    """
    result = RepairResult()
    missing = sorted(set(missing_credit_order_ids))
    credited = set(OrderCredit.objects.filter(order_id__in=missing).values_list("order_id", flat=True))
    orders = Order.objects.in_bulk(missing)
    logs = {
        int(log.foreign_key): log
        for log in TransactionLog.objects.filter(business=BUSINESS_ORDER, foreign_key__in=[str(i) for i in missing])
    }
    to_reset: set[str] = set()
    to_create: list[Order] = []
    for order_id in missing:
        log = logs.get(order_id)
        if order_id in credited:
            result.skipped[str(order_id)] = "credited since the check ran"
        elif order_id not in orders:
            result.skipped[str(order_id)] = "order no longer exists"
        elif log is None:
            to_create.append(orders[order_id])
        elif log.status == TransactionLog.Status.DISCARDED:
            result.skipped[str(order_id)] = f"its message {log.id} was discarded by {log.discarded_by or 'someone'}"
        else:
            to_reset.add(log.id)

    stuck = set(stuck_log_ids)
    still_stuck = set(
        TransactionLog.objects.filter(
            id__in=stuck, status__in=(TransactionLog.Status.PENDING, TransactionLog.Status.DEAD)
        ).values_list("id", flat=True)
    )
    for log_id in sorted(stuck - still_stuck - to_reset):
        result.skipped[log_id] = "published or discarded since the check ran"
    to_reset |= still_stuck

    # The re-published rows keep their trace context, so their awards join the original orders' traces; the
    # repair's own span links to those traces, and messages written here become its children.
    with tracing.span(
        "analytics.repair.reenqueue",
        attributes={"creditshop.reset": len(to_reset), "creditshop.created": len(to_create)},
        linked_to=message_trace_contexts(ids=to_reset).values() if tracing.tracing_enabled() else (),
    ):
        _reenqueue(result, to_reset, to_create)
    return result


def _reenqueue(result: RepairResult, to_reset: set[str], to_create: list[Order]) -> None:
    """Make the rows in `to_reset` due now and write the missing messages of `to_create`, recording each in `result`."""
    if messages_retry_now(ids=sorted(to_reset), republish=True) != len(to_reset):
        # A row changed state between our read and the guarded UPDATE; report what the table says now.
        now_pending = set(
            TransactionLog.objects.filter(id__in=to_reset, status=TransactionLog.Status.PENDING).values_list(
                "id", flat=True
            )
        )
        for log_id in sorted(to_reset - now_pending):
            result.skipped[log_id] = "changed state during the repair"
        to_reset = now_pending
    result.reset = sorted(to_reset)

    for order in to_create:
        try:
            with transaction.atomic():
                message = message_create(
                    transaction_id=order.transaction_id,
                    business=BUSINESS_ORDER,
                    foreign_key=str(order.pk),
                    payload=order_message_payload(
                        order_id=order.pk, user_id=order.user_id, total=order.total, created_at=order.created_at
                    ),
                )
        except IntegrityError:
            result.skipped[str(order.pk)] = "an outbox row for it appeared during the repair"
        else:
            result.created.append(message.id)
    result.created.sort()
