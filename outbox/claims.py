"""Claiming due transaction_log rows: lock a batch with SKIP LOCKED, lease it to this relay, commit; give it back.

``claim_due`` is a short transaction: it locks up to a batch of due rows with ``SELECT ... FOR UPDATE SKIP LOCKED``
and pushes their ``next_attempt_at`` out by a lease (a guarded UPDATE), then commits. While it runs other relays skip
the locked rows; once it committed they no longer see them as due. No network call happens inside it. It is two
round trips, in plain SQL (outbox/statements.py says why).

A claim whose COMMIT went out and whose answer never came (the server died, or the link with it) is in doubt:
committed, its rows would stay hidden for the whole lease though nothing was sent. The process keeps such a claim and,
before each claim of its own, gives back its rows once its transaction has ended (``release_in_doubt``); a process
that dies with one leaves its rows to the lease, as it does a claim it holds.
"""

import logging
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import OperationalError, connections, transaction
from django.utils import timezone
from MySQLdb.constants import ER

from core.sql_batches import batch_execute, transaction_abandon
from outbox import statements
from outbox.models import TransactionLog

PENDING = TransactionLog.Status.PENDING

logger = logging.getLogger(__name__)


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


class _InDoubt:
    """This process's claims whose COMMIT was sent and never answered, until settled: given back, or past the lease."""

    def __init__(self):
        self._claims: list[Claim] = []
        self._lock = threading.Lock()

    def keep(self, claim: Claim, error: BaseException) -> None:
        logger.warning(
            "a claim of %d rows in doubt (%s): given back once its transaction has ended", len(claim.messages), error
        )
        with self._lock:
            self._claims.append(claim)

    def settle(self) -> None:
        """Give back each kept claim whose transaction has ended; keep the others for the next call. Raises the
        database's error if it is away (the claim that follows would fail on it too)."""
        if not self._claims:
            return
        with self._lock:
            claims, self._claims = self._claims, []
        unsettled = []
        try:
            while claims:
                claim = claims[0]
                # Past its lease the rows are due again anyway.
                released = release_in_doubt(claim) if claim.lease_until > timezone.now() else 0
                if released is None:
                    unsettled.append(claim)
                elif released:
                    logger.warning("a claim in doubt had committed: its %d rows given back", released)
                claims.pop(0)
        finally:
            with self._lock:
                self._claims.extend(unsettled + claims)


in_doubt = _InDoubt()


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
    in_doubt.settle()
    now = timezone.now()
    lease_until = now + timedelta(seconds=lease_seconds or settings.OUTBOX_LEASE_SECONDS)
    adapt = connection.ops.adapt_datetimefield_value
    claim = None
    # START TRANSACTION rather than atomic's autocommit toggling, which is two round trips more (orders/services.py).
    try:
        with connection.cursor() as cursor:
            _start, locked = batch_execute(
                connection, cursor, statements.claim_lock_batch(), [PENDING, adapt(now), limit]
            )
            rows = locked.rows
            if rows:
                claim = Claim([ClaimedMessage(*values) for values in statements.claimed_values(rows)], lease_until)
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
    except BaseException as error:
        transaction_abandon(connection)
        if claim is not None:
            # The lease may have committed (its COMMIT was sent, or is in the batch that failed): give it back.
            in_doubt.keep(claim, error)
        raise
    return claim or Claim([], lease_until)


def release_claim(claim: Claim) -> int:
    """Give back claimed rows that were never sent: due again now, no attempt counted. Return rows released."""
    if not claim.messages:
        return 0
    return TransactionLog.objects.filter(
        id__in=[m.id for m in claim.messages], status=PENDING, next_attempt_at=claim.lease_until
    ).update(next_attempt_at=timezone.now())


def release_in_doubt(claim: Claim) -> int | None:
    """Give back the rows of a claim in doubt once its transaction has ended; return how many were leased, or None
    while it may still commit.

    The claim's transaction holds its rows' locks until it ends. A COMMIT lost with the server or its connection
    ends it at once; one held up in a silent link may still reach a live server after the link heals, and commit
    then, so the rows are looked at only when no lock is held on them (NOWAIT: a lock held fails at once).
    """
    alias = statements.database()
    rows = TransactionLog.objects.using(alias).filter(id__in=[m.id for m in claim.messages])
    try:
        with transaction.atomic(using=alias):
            list(rows.select_for_update(nowait=True).values_list("pk", flat=True))
            return rows.filter(status=PENDING, next_attempt_at=claim.lease_until).update(next_attempt_at=timezone.now())
    except OperationalError as error:
        if error.args and error.args[0] == ER.LOCK_WAIT_TIMEOUT:
            return None
        raise
