"""The relay's plain SQL on transaction_log, built from the model: the claim (lock and lease) and the published mark.

Why plain SQL: a relay woken by the web drains a few rows at a time, dozens of times a second, and through the ORM
the cost of a drain is mostly fixed: building and compiling its three statements, and ``transaction.atomic``
toggling autocommit around the claim (``SET autocommit=0``, ``COMMIT``, ``SET autocommit=1``). In plain SQL the
claim and the mark cost a fraction of the ORM's CPU (docs/PERFORMANCE.md, "Outbox relay under the web's
wake-ups"). Here the claim is two round trips (``START TRANSACTION`` and the locking SELECT in one batch, the
lease UPDATE and ``COMMIT`` in another; on a Galera node the lease and its ``COMMIT`` go apart, core/sql.Transaction
says why) and the mark one, each built once per process from the model's metadata (``core/sql.py`` says why);
tests/test_hot_path_sql.py checks them against the model. What the claim reads goes through the converters the ORM
would apply (JSON, aware datetimes).
"""

from collections.abc import Sequence
from functools import cache

from django.db import connections, router

from core import sql
from outbox.models import TransactionLog

# What a claim reads of each row, in ClaimedMessage's field order.
CLAIMED_FIELDS = ("id", "payload", "attempts", "created_at", "traceparent", "tracestate")


def database() -> str:
    """Return the alias of the database transaction_log lives in."""
    return router.db_for_write(TransactionLog)


def _names() -> tuple[str, dict[str, str]]:
    """Return the quoted table name and every field's quoted column."""
    qn = connections[database()].ops.quote_name
    meta = TransactionLog._meta
    return qn(meta.db_table), {field.name: qn(field.column) for field in meta.concrete_fields}


@cache
def claim_lock_batch() -> sql.Transaction:
    """Return ``START TRANSACTION`` and the SELECT that locks up to LIMIT due rows, skipping rows others hold.

    Parameters: the pending status, now, the limit. Rows in (next_attempt_at, id) order, the order of the (status,
    next_attempt_at) index (outbox/claims.py says why).
    """
    table, c = _names()
    columns = ", ".join(c[name] for name in CLAIMED_FIELDS)
    # Identifiers come from model metadata, quoted; values are query parameters.
    select = (
        f"SELECT {columns} FROM {table}"  # noqa: S608
        f" WHERE {c['status']} = %s AND {c['next_attempt_at']} <= %s"
        f" ORDER BY {c['next_attempt_at']}, {c['id']} LIMIT %s FOR UPDATE SKIP LOCKED"
    )
    return sql.Transaction((select,), begins=True, commits=False)


@cache
def _lease_head() -> str:
    table, c = _names()
    return f"UPDATE {table} SET {c['next_attempt_at']} = %s WHERE {c['status']} = %s AND {c['id']} IN ("  # noqa: S608


@cache
def claim_lease_batch(rows: int) -> sql.Transaction:
    """Return the UPDATE that leases `rows` locked rows (by id, still pending), and ``COMMIT``.

    Parameters: the lease's end, the pending status, then each id. One per batch size, at most the claim's limit.
    """
    return sql.Transaction((f"{_lease_head()}{', '.join(['%s'] * rows)})",), begins=False, commits=True)


@cache
def _published_head() -> str:
    table, c = _names()
    return (
        f"UPDATE {table} SET {c['status']} = %s, {c['published_at']} = %s"  # noqa: S608
        f" WHERE {c['status']} = %s AND {c['next_attempt_at']} = %s AND {c['id']} IN ("
    )


def mark_published_update(rows: int) -> str:
    """Return the UPDATE that marks `rows` rows published if they are still pending under this claim's lease.

    Parameters: the published status, now, the pending status, the claim's lease end, then each id.
    """
    return f"{_published_head()}{', '.join(['%s'] * rows)})"


@cache
def _converters() -> tuple[tuple, ...]:
    """Return, per claimed column, the (converter, column) pairs the ORM would apply to what MariaDB returns."""
    fields = [TransactionLog._meta.get_field(name) for name in CLAIMED_FIELDS]
    return sql.read_converters(connections[database()], fields)


def claimed_values(rows: Sequence[tuple]) -> list[list]:
    """Return claimed rows' values as the ORM would read them (the payload parsed, datetimes aware)."""
    connection, converters = connections[database()], _converters()
    return [sql.converted(connection, converters, row) for row in rows]
