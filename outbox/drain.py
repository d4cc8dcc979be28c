"""Relaying what is due: claim, publish and mark batch after batch, overlapping them on a backlog.

One pass is three steps, each a function a test can call on its own: ``claim_due`` (outbox/claims.py),
``Publisher.publish`` (outbox/publisher.py), and ``record_outcome`` (outbox/marks.py). A relay that dies after
publishing and before marking leaves its rows leased; they come due again when the lease runs out and are published
a second time. That duplicate is the price of at-least-once; the consumer absorbs it.
"""

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from django.conf import settings
from django.db import connections

from core.broker import BROKER_ERRORS
from outbox.claims import Claim, claim_due, release_claim
from outbox.marks import BatchOutcome, record_outcome
from outbox.publisher import PendingBatch, Publisher


class BrokerUnavailable(Exception):
    """The broker could not be reached, or dropped the connection mid-batch; ``published`` counts what got out."""

    def __init__(self, cause: BaseException, *, published: int):
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.published = published


def relay_batch(
    publisher: Publisher, *, batch_size: int | None = None, lease_seconds: float | None = None
) -> BatchOutcome:
    """Claim, publish and mark one batch. Raises a broker error, having claimed nothing, when it cannot connect."""
    publisher.connect()
    claim = claim_due(limit=batch_size or settings.OUTBOX_BATCH_SIZE, lease_seconds=lease_seconds)
    if not claim.messages:
        return BatchOutcome()
    return record_outcome(claim, publisher.publish(claim.messages))


def drain(
    publisher: Publisher,
    *,
    batch_size: int | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    time_budget: float | None = None,
) -> int:
    """Relay batches until nothing is due, `should_stop()` or the time budget runs out; return how many published.

    A short batch means nothing else is due (rows other relays hold are skipped, not waited for), so this also ends
    when several relays share the work. Raises BrokerUnavailable if the broker cannot be reached (nothing is claimed
    then) or fails mid-batch (after recording the batch's failures).
    """
    batch_size = batch_size or settings.OUTBOX_BATCH_SIZE
    deadline = None if time_budget is None else time.monotonic() + time_budget

    def out_of_time() -> bool:
        return should_stop() or (deadline is not None and time.monotonic() >= deadline)

    try:
        publisher.connect()
    except BROKER_ERRORS as exc:
        publisher.close(graceful=False)
        raise BrokerUnavailable(exc, published=0) from exc
    claim = claim_due(limit=batch_size)
    if len(claim.messages) == batch_size and not out_of_time():
        outcomes = _drain_backlog(publisher, claim, batch_size=batch_size, out_of_time=out_of_time)
    elif claim.messages:
        # The common case after a wake-up: a few rows, one batch, no helper thread.
        outcomes = [record_outcome(claim, publisher.publish(claim.messages))]
    else:
        outcomes = []
    published = sum(outcome.published for outcome in outcomes)
    for outcome in outcomes:
        if outcome.broker_error is not None:
            raise BrokerUnavailable(outcome.broker_error, published=published) from outcome.broker_error
    return published


def _drain_backlog(
    publisher: Publisher, claim: Claim, *, batch_size: int, out_of_time: Callable[[], bool]
) -> list[BatchOutcome]:
    """Relay a backlog with the database and the broker busy at the same time.

    While this thread writes the current batch to the broker, one helper thread claims the next batch and another
    marks the previous one, each on its own database connection (the two statements touch different rows, so
    neither waits for the other, where one helper would run them one after the other). The confirms of batch n are
    collected after batch n+1 is written, so at most two batches are unconfirmed and the wait mostly finds them already
    in.
    Each step is still the plain claim_due / Publisher / record_outcome, in that order for any one batch.
    """
    recorded: list[Future] = []
    with (
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="outbox-claim") as claims,
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="outbox-mark") as marks,
    ):
        try:
            written: tuple[Claim, PendingBatch] | None = None
            next_claim: Future | None = None
            while claim.messages:
                if len(claim.messages) == batch_size and not out_of_time():
                    next_claim = claims.submit(claim_due, limit=batch_size)
                pending = publisher.send(claim.messages)
                if written is not None:
                    recorded.append(marks.submit(record_outcome, written[0], publisher.wait(written[1])))
                written = (claim, pending)
                if pending.result.broker_error is not None:
                    break
                claim = next_claim.result() if next_claim is not None else Claim([], claim.lease_until)
                next_claim = None
            if written is not None:
                recorded.append(marks.submit(record_outcome, written[0], publisher.wait(written[1])))
            if next_claim is not None:
                claims.submit(release_claim, next_claim.result())
            return [future.result() for future in recorded]
        finally:
            claims.submit(connections.close_all)
            marks.submit(connections.close_all)
