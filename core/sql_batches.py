"""Running a multi-statement batch in one round trip, and what each of its statements reported.

The hot paths send their statements (built in core/sql.py) as one batch: the order, its outbox row and its
idempotency record (orders/statements.py), the award's balance and credit (credits/services.py), the relay's claim
(outbox/claims.py). MariaDB stops a batch at its first failing statement, and that error reaches the client only when
its result is read, so each function here reads every result before it returns; a transaction the batch opened is
rolled back by the caller (transaction_abandon).
"""

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def transaction_abandon(connection) -> None:
    """Roll back the transaction a failed batch left open; if even that fails, close the connection.

    A closed connection's transaction is rolled back by the server, so nothing half-written can outlive it.
    """
    try:
        with connection.cursor() as cursor:
            cursor.execute("ROLLBACK")
    except Exception:
        connection.close()


@dataclass(frozen=True)
class StatementResult:
    """What one statement of a batch reported: rows matched or written, the auto-increment key it generated, and
    the rows it read (a SELECT's; empty for any other statement)."""

    rowcount: int
    lastrowid: int | None
    rows: tuple = ()


def batch_execute(connection, cursor, batch: str, params: Sequence[Any]) -> list[StatementResult]:
    """Run a multi-statement batch in one round trip on a Django cursor; return each statement's result.

    MariaDB stops a batch at its first failing statement, and that error reaches the client only when its result is
    read, so every result is read inside the execute call: Django's execute wrappers (the query log, the SQL span)
    see the batch fail as one statement, and the error arrives as Django's DatabaseError. A transaction the batch
    opened is still open after an error: the caller rolls it back.
    """
    # The results are read on the driver's cursor: Django's two cursor wrappers cost more per call than a read does.
    driver_cursor = cursor.cursor.cursor
    results = []

    def result() -> StatementResult:
        rows = driver_cursor.fetchall() if driver_cursor.description else ()
        return StatementResult(driver_cursor.rowcount, driver_cursor.lastrowid, rows)

    def read_every_result(execute, sql, params, many, context):
        outcome = execute(sql, params, many, context)
        results.append(result())
        with connection.wrap_database_errors:
            while driver_cursor.nextset():
                results.append(result())
        return outcome

    with connection.execute_wrapper(read_every_result):
        cursor.execute(batch, params)
    return results


def batch_row_counts(connection, batch: str, params: Sequence[Any]) -> list[int]:
    """Run a multi-statement batch (or one statement) on its own cursor; return each statement's row count, raising
    the first error. For batches that read no rows, on a hot path (the credit award).

    A later statement's error reaches the client only when its result is read, so every result is read before this
    returns, inside the database error translation, and the batch fails as one statement. Where something wraps
    statements (an execute wrapper such as the SQL span, or the debug query log) or inside a transaction (a replay), it
    goes through Django's cursor, the results read inside the execute call, so a wrapper sees the whole batch too.
    """
    return [result.rowcount for result in _unread_batch(connection, batch, params)]


def batch_insert_ids(connection, batch: str, params: Sequence[Any]) -> list[int]:
    """Run a multi-statement batch as batch_row_counts does; return the auto-increment key each statement generated
    (0 for a statement that generated none). For batches that read no rows, on a hot path (the order request)."""
    return [result.lastrowid or 0 for result in _unread_batch(connection, batch, params)]


def _unread_batch(connection, batch: str, params: Sequence[Any]) -> list[StatementResult]:
    """Run a batch whose statements read no rows on the backend's own cursor, and return what each reported; through
    Django's cursor (batch_execute) where it must be (see batch_row_counts)."""
    if connection.execute_wrappers or connection.queries_logged or connection.in_atomic_block:
        with connection.cursor() as cursor:
            return batch_execute(connection, cursor, batch, params)
    # Otherwise on the backend's own cursor, opened the way connection.cursor() opens one (health check, connection,
    # thread check) but without Django's wrapper around it, which has nothing to do here: creating, entering and
    # closing that wrapper, and calling through it, cost about a tenth of a worker's Python CPU per award.
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    connection.validate_thread_sharing()
    with connection.wrap_database_errors:
        cursor = connection.create_cursor()
        try:
            cursor.execute(batch, params)  # the backend's wrapper, which maps its integrity error codes
            return _driver_results(cursor.cursor)
        finally:
            with contextlib.suppress(connection.Database.Error):  # as Django's cursor closes: the error was raised
                cursor.close()


def _driver_results(driver_cursor) -> list[StatementResult]:
    """Return what each statement of the batch the driver cursor just ran reported, its first result in hand.

    The later results are read on the driver's connection: the batch's statements return no rows, so there is no
    result set to store, and the cursor's nextset() (storing and describing each result) costs more than the reads.
    """
    results = [StatementResult(driver_cursor.rowcount, driver_cursor.lastrowid)]
    driver_connection = driver_cursor.connection
    while driver_connection.next_result() == 0:  # -1: no more results; an error raises
        results.append(StatementResult(driver_connection.affected_rows(), driver_connection.insert_id()))
    return results
