"""Claiming due transaction_log rows: lock a batch with SKIP LOCKED, lease it to this relay, commit; give it back.

``claim_due`` is a short transaction: it locks up to a batch of due rows with ``SELECT ... FOR UPDATE SKIP LOCKED``
and pushes their ``next_attempt_at`` out by a lease (a guarded UPDATE), then commits. While it runs other relays skip
the locked rows; once it committed they no longer see them as due. No network call happens inside it. It is two
round trips, in plain SQL (outbox/statements.py says why).
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connections
from django.utils import timezone

from core.sql_batches import batch_execute, transaction_abandon
from outbox import statements
from outbox.models import TransactionLog

PENDING = TransactionLog.Status.PENDING


@dataclass(frozen=True)
class ClaimedMessage:
    id: str
    payload: dict
    attempts: int
    # When the row was written (with its order), and the trace context of the request that wrote it.
    created_at: datetime | None = None
    traceparent: str = ""
    tracestate: str = ""


@dataclass(frozen=True)
class Claim:
    """Rows one relay holds until ``lease_until``, the value it wrote to their next_attempt_at."""

    messages: list[ClaimedMessage]
    lease_until: datetime


def claim_due(*, limit: int, lease_seconds: float | None = None) -> Claim:
    """Lock up to `limit` due rows, lease them to this relay and commit; return what was claimed.

    Rows are taken in (next_attempt_at, id) order: the order of the (status, next_attempt_at) index, so the scan stops
    after `limit` rows and locks nothing else. Ordering by id alone would sort every due row, locking them all.
    Ids are time-ordered, so fresh rows still go out roughly in commit order; no "last id seen" cursor is kept,
    because ids do not commit in order.
    """
    connection = connections[statements.database()]
    if connection.in_atomic_block:
        raise RuntimeError("claim_due commits its claim before anything is published; call it outside a transaction")
    now = timezone.now()
    lease_until = now + timedelta(seconds=lease_seconds or settings.OUTBOX_LEASE_SECONDS)
    adapt = connection.ops.adapt_datetimefield_value
    # START TRANSACTION rather than atomic's autocommit toggling, which is two round trips more (orders/services.py).
    try:
        with connection.cursor() as cursor:
            _start, locked = batch_execute(
                connection, cursor, statements.claim_lock_batch(), [PENDING, adapt(now), limit]
            )
            rows = locked.rows
            if rows:
                ids = [row[0] for row in rows]
                lease, _commit = batch_execute(
                    connection, cursor, statements.claim_lease_batch(len(ids)), [adapt(lease_until), PENDING, *ids]
                )
                leased = lease.rowcount
                if leased != len(ids):
                    # Cannot happen while we hold the row locks; refuse rather than publish rows we do not own.
                    raise RuntimeError(f"leased {leased} of {len(ids)} locked rows")
            else:
                cursor.execute("COMMIT")
    except BaseException:
        transaction_abandon(connection)
        raise
    return Claim(
        messages=[ClaimedMessage(*values) for values in statements.claimed_values(rows)], lease_until=lease_until
    )


def release_claim(claim: Claim) -> int:
    """Give back claimed rows that were never sent: due again now, no attempt counted. Return rows released."""
    if not claim.messages:
        return 0
    return TransactionLog.objects.filter(
        id__in=[m.id for m in claim.messages], status=PENDING, next_attempt_at=claim.lease_until
    ).update(next_attempt_at=timezone.now())
