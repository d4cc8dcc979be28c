"""Writes for credits: awarding an order's credits exactly once in effect, and resolving dead-lettered messages.

How the balance stays right under concurrency, and why awards for one user cannot deadlock
------------------------------------------------------------------------------------------
An award is one short transaction taking exactly two exclusive row locks, always in this order:

1. the user's credit_balances row, by ``UPDATE ... SET balance = balance + %s``: a relative update computed by the
   server under the row lock, so no award overwrites another's (no lost updates, no read-modify-write);
2. the order_credits UNIQUE(order_id) entry, by inserting the credit row. A duplicate fails here on the unique key
   and the whole transaction, balance change included, rolls back: the database, not memory, decides duplicates.

Every award for one user queues on lock (1) before it touches order_credits, and an order belongs to one user, so
at most one transaction at a time inserts (or rolls back) a given order's entry: no cycle is possible. The opposite
order deadlocks: when an insert that others wait on is rolled back, the waiters each hold a shared lock on the key
and each need an exclusive one (InnoDB's classic duplicate-key deadlock, which test_concurrency hits in that order).

The balance row is never *inserted* inside an award transaction, for the same reason: concurrent
``INSERT ... ON DUPLICATE KEY UPDATE`` of one new key inside longer transactions deadlocks the same way. An UPDATE
that finds no row locks nothing (READ COMMITTED takes no gap locks), so the award then creates the row with
``credit_balance_ensure`` in its own autocommit statement, whose locks end with the statement, and runs again.
Rows are never deleted, so this happens once per user.

The whole transaction is one network round trip: ``START TRANSACTION``, the UPDATE, the INSERT and ``COMMIT`` go
to the server as one multi-statement batch (award_batch), the INSERT guarded by the UPDATE's row count; on a Galera
node one statement per round trip instead (core/sql.Transaction says why). The server
stops the batch at the first error, leaving the transaction open; the award then rolls it back (or, if that fails,
closes the connection, which rolls it back too), so a duplicate's balance change is undone as before. A worker that
dies once the batch is sent does not stop it: the server runs it to its COMMIT, and the redelivered message is a
duplicate, as after a worker killed between commit and acknowledgement (credits/tests/test_worker.py). Measured
against the autocommit toggling of ``transaction.atomic`` (five round trips): see docs/PERFORMANCE.md.

What the award trusts
---------------------
The credits service has its own database and never reads the order service's: the message is all it knows. A
well-formed message (credits.messages checks the schema version, the ids and the total's bounds) is awarded as it
says. An order that does not exist, or disagrees with the credit given for it, is what the nightly consistency
checks find (orphan_credit, credit_amount_mismatch); see docs/ARCHITECTURE.md.
"""

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connections, router, transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from core import sql, sql_batches
from core.contract import TRANSACTION_ID
from core.errors import ReasonRequired
from core.retention import purge_in_batches
from credits.messages import award_message_parse
from credits.models import CreditBalance, DeadLetter, OrderCredit
from credits.retry import failure_classify

CREDITS_PER_UNIT = 2
ERROR_TEXT_MAX = 4000
MESSAGE_ID_MAX = 255


@dataclass(frozen=True)
class CreditAward:
    order_id: int
    amount: int
    created: bool


def credits_database() -> str:
    """Return the alias of the credits service's database, where every statement of this module runs."""
    return router.db_for_write(OrderCredit)


# The award is the consumer's hot path, so its statements are plain SQL built from the models (core/sql.py says why,
# with the measurement); test_services reads the rows back through the ORM. The balance starts at its database default.
BALANCE_CREATE = sql.Insert(CreditBalance, ("user_id", "balance", "updated_at"), keep_existing=True)
BALANCE_ADD = sql.Update(CreditBalance, increment=("balance",), assign=("updated_at",), where=("user_id",))
# Sent right after BALANCE_ADD in one batch, so nothing can look between the two: the credit row is written only when
# the UPDATE found the user's balance row (ROW_COUNT() is the previous statement's row count, here with Django's
# CLIENT.FOUND_ROWS the rows matched).
CREDIT_INSERT = sql.Insert(
    OrderCredit,
    ("order_id", "user_id", "amount", "transaction_id", "created_at", "ordered_at"),
    only_if="ROW_COUNT() = 1",
)


@functools.cache
def award_batch(*, own_transaction: bool) -> sql.Transaction:
    """Return the award's statements as one multi-statement batch (core/sql.Transaction): one network round trip for
    the whole award, its own transaction or, without `own_transaction`, inside the caller's."""
    return sql.Transaction((BALANCE_ADD.sql, CREDIT_INSERT.sql), begins=own_transaction, commits=own_transaction)


def credit_balance_ensure(*, user_id: int) -> None:
    """Create the user's zero balance row if it is missing, in a statement of its own (see the module docstring)."""
    connection = connections[credits_database()]
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    sql_batches.batch_row_counts(connection, BALANCE_CREATE.sql, [user_id, 0, now])


def _credit_insert(
    *, transaction_id: str, order_id: int, user_id: int, amount: int, ordered_at: datetime | None
) -> bool:
    """Add the credit to the balance and insert its row in one transaction; write nothing without a balance row.

    Return whether the credit was written (False: the user has no balance row yet).
    """
    alias = credits_database()
    connection = connections[alias]
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    ordered_at = connection.ops.adapt_datetimefield_value(ordered_at)
    params = [amount, now, user_id, order_id, user_id, amount, transaction_id, now, ordered_at]
    if connection.in_atomic_block:
        # Inside a caller's transaction (a replay): a savepoint, so a duplicate undoes only this balance change.
        with transaction.atomic(using=alias):
            _update, insert = sql_batches.batch_row_counts(connection, award_batch(own_transaction=False), params)
        return insert == 1
    try:
        _start, _update, insert, _commit = sql_batches.batch_row_counts(
            connection, award_batch(own_transaction=True), params
        )
    except BaseException:
        sql_batches.transaction_abandon(connection)
        raise
    return insert == 1


def credit_award(
    *, transaction_id: str, order_id: int, user_id: int, total: int, ordered_at: datetime | None = None
) -> CreditAward:
    """Award 2 x total credits for the order once; any later award for the same order changes nothing.

    Trusts its (parsed, well-formed) message: the order service's database is never read. `ordered_at` is when the
    order was placed, from a version-2 message on. Inside a caller's transaction, call credit_balance_ensure for the
    user beforehand.
    """
    amount = CREDITS_PER_UNIT * total
    fields = {
        "transaction_id": transaction_id,
        "order_id": order_id,
        "user_id": user_id,
        "amount": amount,
        "ordered_at": ordered_at,
    }
    try:
        inserted = _credit_insert(**fields)
        if not inserted:
            credit_balance_ensure(user_id=user_id)
            inserted = _credit_insert(**fields)
    except IntegrityError:
        if OrderCredit.objects.filter(order_id=order_id).exists():
            return CreditAward(order_id=order_id, amount=amount, created=False)
        raise
    if not inserted:
        raise RuntimeError(f"the credit balance row of user {user_id} is missing right after it was created")
    return CreditAward(order_id=order_id, amount=amount, created=True)


def _payload_ids(payload: Any) -> tuple[str, int | None]:
    """Return the transaction id and order id a payload carries, as far as they can be read."""
    if not isinstance(payload, dict):
        return "", None
    transaction_id = payload.get("transaction_id")
    order_id = payload.get("order_id")
    return (
        transaction_id if isinstance(transaction_id, str) and TRANSACTION_ID.fullmatch(transaction_id) else "",
        order_id if type(order_id) is int and 0 < order_id < 2**63 else None,
    )


def dead_letter_record(
    *,
    message_id: str,
    payload: Any,
    reason: str,
    error: str,
    attempts: int,
    first_failed_at,
    last_failed_at,
    trace_context: tuple[str, str] = ("", ""),
) -> None:
    """Record a message that failed for good; one row per message, reopened if the same message fails again.

    `trace_context` is the (traceparent, tracestate) the message was handled in, for a replay's span to link to.

    A row an operator discarded stays discarded: that decision covers every copy of the message.
    Call it outside a transaction; two workers recording the same message at once end with one row.
    """
    message_id = message_id[:MESSAGE_ID_MAX]
    error = error[:ERROR_TEXT_MAX]
    again = {
        "reason": reason,
        "error": error,
        "last_failed_at": last_failed_at,
        "attempts": F("attempts") + attempts,
        "status": Case(
            When(status=DeadLetter.Status.DISCARDED, then=Value(DeadLetter.Status.DISCARDED)),
            default=Value(DeadLetter.Status.OPEN),
        ),
    }
    if DeadLetter.objects.filter(message_id=message_id).update(**again):
        return
    transaction_id, order_id = _payload_ids(payload)
    try:
        with transaction.atomic(using=credits_database()):
            DeadLetter.objects.create(
                message_id=message_id,
                transaction_id=transaction_id,
                order_id=order_id,
                payload=payload,
                reason=reason,
                error=error,
                attempts=attempts,
                first_failed_at=first_failed_at,
                last_failed_at=last_failed_at,
                traceparent=trace_context[0],
                tracestate=trace_context[1],
            )
    except IntegrityError:
        DeadLetter.objects.filter(message_id=message_id).update(**again)


class ReplayOutcome:
    AWARDED = "awarded"
    ALREADY_AWARDED = "already_awarded"
    NOT_OPEN = "not_open"
    FAILED = "failed"


@dataclass(frozen=True)
class Replay:
    dead_letter_id: int
    outcome: str
    error: str = ""


def dead_letter_replay(*, dead_letter_id: int, by: str) -> Replay:
    """Apply an open dead letter's message through the same award path and mark it replayed by whom and when.

    Replaying twice awards once: the row lock and the status guard let one replay through, and credit_award turns
    any repeat into a no-op. A replay that fails again leaves the row open with the new error and one more attempt.
    """
    letter = DeadLetter.objects.filter(pk=dead_letter_id, status=DeadLetter.Status.OPEN).first()
    if letter is None:
        return Replay(dead_letter_id=dead_letter_id, outcome=ReplayOutcome.NOT_OPEN)
    try:
        message = award_message_parse(letter.payload)
        credit_balance_ensure(user_id=message.user_id)
        with transaction.atomic(using=credits_database(), durable=True):
            locked = DeadLetter.objects.select_for_update().filter(pk=dead_letter_id, status=DeadLetter.Status.OPEN)
            if not locked.exists():
                return Replay(dead_letter_id=dead_letter_id, outcome=ReplayOutcome.NOT_OPEN)
            award = credit_award(
                transaction_id=message.transaction_id,
                order_id=message.order_id,
                user_id=message.user_id,
                total=message.total,
                ordered_at=message.ordered_at,
            )
            locked.update(status=DeadLetter.Status.REPLAYED, replayed_at=timezone.now(), replayed_by=by)
    except Exception as exc:  # every failure is reported on the row and to the operator, none is raised
        failure = failure_classify(exc)
        DeadLetter.objects.filter(pk=dead_letter_id, status=DeadLetter.Status.OPEN).update(
            reason=failure.reason,
            error=failure.error[:ERROR_TEXT_MAX],
            attempts=F("attempts") + 1,
            last_failed_at=timezone.now(),
        )
        return Replay(dead_letter_id=dead_letter_id, outcome=ReplayOutcome.FAILED, error=failure.error)
    outcome = ReplayOutcome.AWARDED if award.created else ReplayOutcome.ALREADY_AWARDED
    return Replay(dead_letter_id=dead_letter_id, outcome=outcome)


def dead_letters_discard(*, dead_letter_ids: Iterable[int], by: str, reason: str) -> int:
    """Mark the open dead letters among these discarded, with who, when and why; return how many changed."""
    reason = reason.strip()
    if not reason:
        raise ReasonRequired("A reason is required to discard a dead letter.")
    return DeadLetter.objects.filter(pk__in=list(dead_letter_ids), status=DeadLetter.Status.OPEN).update(
        status=DeadLetter.Status.DISCARDED, discarded_at=timezone.now(), discarded_by=by, discarded_reason=reason
    )


# Retention of resolved dead letters: kept apart from the award and replay code above on purpose.


def dead_letters_purge_resolved(*, resolved_before: datetime, batch_size: int = 1000) -> int:
    """Delete dead letters replayed or discarded before `resolved_before`, in batches by primary key; return how many.

    Open rows are never deleted, however old: they are the operator's worklist. Once a row is gone, a later copy
    of the same message (a redelivery) is recorded as a new open dead letter instead of staying resolved.
    """
    resolved = Q(status=DeadLetter.Status.REPLAYED, replayed_at__lt=resolved_before) | Q(
        status=DeadLetter.Status.DISCARDED, discarded_at__lt=resolved_before
    )
    return purge_in_batches(DeadLetter.objects.filter(resolved), order_by="pk", batch_size=batch_size)
