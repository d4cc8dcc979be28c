"""Recording what the broker said about a claimed batch: confirmed rows published, failed ones retried or dead.

Each mark is one UPDATE guarded by the claim's lease value, so a relay that lost its lease (it ran longer than
OUTBOX_LEASE_SECONDS, or an operator retried or discarded the rows) changes nothing. The published mark, one per
batch, is plain SQL (outbox/statements.py); a failure's, rare, goes through the ORM.
"""

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connections
from django.db.models import Case, Value, When
from django.utils import timezone

from outbox import metrics, statements
from outbox.claims import PENDING, Claim, ClaimedMessage
from outbox.models import TransactionLog
from outbox.publisher import PublishResult
from outbox.retry import retry_delay

logger = logging.getLogger(__name__)

PUBLISHED = TransactionLog.Status.PUBLISHED
# Broker-side reasons are kept in last_error; a bounded length keeps a pathological message out of the table.
MAX_ERROR_LENGTH = 1000


@dataclass(frozen=True)
class BatchOutcome:
    claimed: int = 0
    published: int = 0
    failed: int = 0
    dead: int = 0
    broker_error: BaseException | None = None


def mark_published(claim: Claim, ids: Sequence[str]) -> int:
    """Mark the confirmed rows of a claim published in one UPDATE; return how many this relay still owned."""
    if not ids:
        return 0
    connection = connections[statements.database()]
    adapt = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        cursor.execute(
            statements.mark_published_update(len(ids)),
            [PUBLISHED, adapt(timezone.now()), PENDING, adapt(claim.lease_until), *ids],
        )
        updated = cursor.rowcount
    if updated != len(ids):
        logger.info(
            "outbox: %d of %d published rows had changed since the claim (lease lost, retried or discarded)",
            len(ids) - updated,
            len(ids),
        )
    metrics.PUBLISHED.inc(updated)
    return updated


def mark_failed(claim: Claim, failures: dict[str, str]) -> tuple[int, int]:
    """Record failed publishes: attempts+1 and a backoff, or dead at the limit. Return (retrying, dead)."""
    if not failures:
        return 0, 0
    now = timezone.now()
    max_attempts = settings.OUTBOX_MAX_ATTEMPTS
    retry, dead = [], []
    for message in claim.messages:
        if message.id in failures:
            (dead if message.attempts + 1 >= max_attempts else retry).append(message)

    def update(messages: list[ClaimedMessage], status: str, next_attempt_at: Callable[[ClaimedMessage], datetime]):
        if not messages:
            return 0
        return TransactionLog.objects.filter(
            id__in=[m.id for m in messages], status=PENDING, next_attempt_at=claim.lease_until
        ).update(
            status=status,
            attempts=Case(*[When(id=m.id, then=Value(m.attempts + 1)) for m in messages]),
            next_attempt_at=Case(*[When(id=m.id, then=Value(next_attempt_at(m))) for m in messages]),
            last_error=Case(*[When(id=m.id, then=Value(failures[m.id][:MAX_ERROR_LENGTH])) for m in messages]),
        )

    retrying = update(retry, PENDING, lambda m: now + timedelta(seconds=retry_delay(m.attempts + 1)))
    died = update(dead, TransactionLog.Status.DEAD, lambda m: now)
    metrics.FAILED.inc(len(failures))
    metrics.DEAD.inc(died)
    if retry:
        logger.warning(
            "outbox: %d message(s) not confirmed, retrying with backoff; first: %s (%s)",
            len(retry),
            retry[0].id,
            failures[retry[0].id],
        )
    for message in dead:
        logger.error(
            "outbox: message %s is dead after %d failed publishes: %s",
            message.id,
            message.attempts + 1,
            failures[message.id],
            extra={"transaction_id": message.id},
        )
    return retrying, died


def record_outcome(claim: Claim, result: PublishResult) -> BatchOutcome:
    """Mark a published batch: confirmed rows published in one UPDATE, failed ones retried later or dead."""
    published = mark_published(claim, result.confirmed)
    retrying, dead = mark_failed(claim, result.failed)
    return BatchOutcome(
        claimed=len(claim.messages),
        published=published,
        failed=retrying + dead,
        dead=dead,
        broker_error=result.broker_error,
    )
