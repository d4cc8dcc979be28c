"""Writes to the outbox: adding a message in the caller's transaction, waking the relay, and the operator's fixes."""

import json
from collections.abc import Iterable
from datetime import datetime

from django.db import connection, transaction
from django.utils import timezone

from core import sql
from core.contract import SCHEMA_VERSION
from core.errors import ReasonRequired
from core.retention import purge_in_batches
from core.tracing import current_trace_context
from outbox import wakeup
from outbox.models import TransactionLog

Status = TransactionLog.Status

# States a person may send back to the relay: stuck or backing-off rows, given-up rows, and a discard undone.
# Published rows are not among them: the broker has them, and a replay belongs to the consumer's dead letters.
RETRYABLE = (Status.PENDING, Status.DEAD, Status.DISCARDED)
# States the nightly repair sends again for a credit that never arrived: a published message may have been lost
# after the broker confirmed it (a purged queue), and the consumer absorbs a duplicate. A discarded row was discarded
# by a person, with a reason; a repair must not overrule that.
REPUBLISHABLE = (Status.PENDING, Status.DEAD, Status.PUBLISHED)
DISCARDABLE = (Status.PENDING, Status.DEAD)


# Part of the order request's hot path, so plain SQL built from the model like the order insert beside it (core/sql.py
# says why). The delivery columns (attempts, published_at, last_error, discarded_*) start at their database defaults;
# test_services reads the row back through the ORM.
MESSAGE_INSERT = sql.Insert(
    TransactionLog,
    (
        "id",
        "business",
        "foreign_key",
        "payload",
        "status",
        "next_attempt_at",
        "created_at",
        "traceparent",
        "tracestate",
    ),
)


def message_create(*, transaction_id: str, business: str, foreign_key: str, payload: dict) -> TransactionLog:
    """Insert one outbox row in the current transaction and wake the relay once that transaction commits.

    The row keeps the current trace context (the order request's), which the relay sends along with the message.
    (The order request writes its row in its own batch: orders/services.py.)
    """
    values, parameters = message_row(
        transaction_id=transaction_id, business=business, foreign_key=foreign_key, payload=payload
    )
    with connection.cursor() as cursor:
        cursor.execute(MESSAGE_INSERT.sql, parameters)
    transaction.on_commit(wake_relay, robust=True)
    return MESSAGE_INSERT.instance(connection.alias, values)


def message_row(*, transaction_id: str, business: str, foreign_key: str, payload: dict) -> tuple[list, list]:
    """Return a new outbox row's values and their database parameters, each in MESSAGE_INSERT's field order.

    The row is pending, due now, and keeps the current trace context (the order request's), which the relay sends
    along with the message; the payload gains the schema version and the transaction id.
    """
    payload = {"schema_version": SCHEMA_VERSION, "transaction_id": transaction_id, **payload}
    now = timezone.now()
    db_now = connection.ops.adapt_datetimefield_value(now)
    traceparent, tracestate = current_trace_context()
    head = [transaction_id, business, foreign_key]
    tail = [Status.PENDING, now, now, traceparent, tracestate]
    values = [*head, payload, *tail]
    parameters = [*head, json.dumps(payload), Status.PENDING, db_now, db_now, traceparent, tracestate]
    return values, parameters


def wake_relay() -> None:
    """Ask a relay to publish what is due now; returns at once and never raises, even with the broker down."""
    wakeup.waker.wake()


def messages_retry_now(*, ids: Iterable[str], republish: bool = False) -> int:
    """Send the given rows back to the relay, due now with a fresh attempt count, and wake it once committed.

    From RETRYABLE states, or REPUBLISHABLE ones for the nightly repair (`republish=True`). One guarded UPDATE:
    rows that moved to another state meanwhile are left alone. Return how many rows changed. A row a relay holds
    right now may then go out twice; the consumer absorbs that.
    """
    ids = list(ids)
    if not ids:
        return 0
    with transaction.atomic():
        changed = TransactionLog.objects.filter(
            id__in=ids, status__in=REPUBLISHABLE if republish else RETRYABLE
        ).update(
            status=Status.PENDING, attempts=0, next_attempt_at=timezone.now(), discarded_reason="", discarded_by=""
        )
        if changed:
            transaction.on_commit(wake_relay, robust=True)
    return changed


def messages_discard(*, ids: Iterable[str], reason: str, actor: str) -> int:
    """Take the given pending or dead rows out of the relay for good, recording why and who. Return rows changed."""
    reason = reason.strip()
    if not reason:
        raise ReasonRequired("Discarding a message needs a reason.")
    ids = list(ids)
    if not ids:
        return 0
    return TransactionLog.objects.filter(id__in=ids, status__in=DISCARDABLE).update(
        status=Status.DISCARDED, discarded_reason=reason, discarded_by=actor[:150]
    )


def messages_purge_published(*, older_than: datetime, batch_size: int, max_batches: int | None = None) -> int:
    """Delete published rows published before `older_than`, `batch_size` rows per statement; return how many.

    Each batch is its own short autocommit DELETE by primary key, so order inserts (which append at the other end
    of the time-ordered primary key) never wait behind a long purge.
    """
    return purge_in_batches(
        TransactionLog.objects.filter(status=Status.PUBLISHED, published_at__lt=older_than),
        order_by="published_at",
        batch_size=batch_size,
        max_batches=max_batches,
    )
