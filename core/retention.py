"""Retention: deleting old rows of a big table in short batches, so the writes beside it never wait behind a purge."""

from django.db.models import QuerySet

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
