"""Retention: deleting old rows of a big table in short batches, so the writes beside it never wait behind a purge."""

import logging
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

# A beat-driven purge stops after this many batches per run, so one run never holds a worker for long; the next
# run goes on where it stopped.
PURGE_MAX_BATCHES = 1000


def purge_in_batches(rows: QuerySet, *, order_by: str, batch_size: int, max_batches: int | None = None) -> int:
    """Delete `rows`, oldest first by `order_by`, `batch_size` per statement; return how many were deleted.

    Each batch is its own short autocommit DELETE by primary key, re-checked against the filter, so a row that
    changed meanwhile (a published outbox row sent back to the relay) is left alone.
    """
    deleted = batches = 0
    while max_batches is None or batches < max_batches:
        ids = list(rows.order_by(order_by).values_list("pk", flat=True)[:batch_size])
        if not ids:
            break
        count, _ = rows.filter(pk__in=ids).delete()
        deleted += count
        batches += 1
        if len(ids) < batch_size:
            break
    return deleted


def scheduled_purge(purge: Callable[..., int], *, keep: timedelta, rows: str, log: logging.Logger) -> int:
    """Run one beat-driven purge: `purge` the rows older than `keep`, in short batches and at most PURGE_MAX_BATCHES
    of them (OUTBOX_RETENTION_BATCH_SIZE rows each); log how many went, if any, and return it.

    `purge` is a service taking keyword arguments older_than, batch_size and max_batches (purge_in_batches underneath).
    """
    deleted = purge(
        older_than=timezone.now() - keep,
        batch_size=settings.OUTBOX_RETENTION_BATCH_SIZE,
        max_batches=PURGE_MAX_BATCHES,
    )
    if deleted:
        log.info("purged %d %s older than %s", deleted, rows, _age(keep))
    return deleted


def _age(keep: timedelta) -> str:
    hours = keep.total_seconds() / 3600
    count, unit = (hours / 24, "day") if hours % 24 == 0 else (hours, "hour")
    return f"{count:g} {unit}{'' if count == 1 else 's'}"
