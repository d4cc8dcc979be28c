"""Running a transaction's statements in as few round trips as the server allows, and what each of them reported.

The hot paths send their statements (built in core/sql.py) as one batch: the order, its outbox row and its
idempotency record (orders/statements.py), the award's balance and credit (credits/services.py), the relay's claim
(outbox/claims.py). On a Galera node they go one statement per round trip instead (core/sql.Transaction says why),
which the connection's server tells once per connection (galera_node). MariaDB stops a batch at its first failing
statement, and that error reaches the client only when its result is read, so each function here reads every result
before it returns; a transaction the batch opened is rolled back by the caller (transaction_abandon).
"""

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from core.sql import Transaction

# The server's answer to a variable it does not know (a MySQL server has no wsrep_on).
ER_UNKNOWN_SYSTEM_VARIABLE = 1193
# Where a driver connection keeps what its server said it is (an attribute of its own: the connection is the cache).
_GALERA_NODE = "creditshop_galera_node"


def galera_node(connection) -> bool:
    """Return whether this open connection's session replicates its writes through Galera (wsrep_on), asked of the
    server once per driver connection: a connection through the cluster's endpoint reaches a node, the system server
    does not, and a new connection may reach another server."""
    driver = connection.connection
    known = getattr(driver, _GALERA_NODE, None)
    if known is None:
        with connection.wrap_database_errors:
            try:
                driver.query("SELECT @@SESSION.wsrep_on")
                ((value,),) = driver.store_result().fetch_row()
                known = bool(int(value))
            except connection.Database.OperationalError as exc:
                if exc.args[0] != ER_UNKNOWN_SYSTEM_VARIABLE:
                    raise
                known = False
        setattr(driver, _GALERA_NODE, known)
    return known


def _round_trips(connection, batch: Transaction | str, params: Sequence[Any]) -> list[tuple[str, Sequence[Any]]]:
    """Return the statements and parameters of each round trip the batch takes on this connection's server."""
    if isinstance(batch, str):
        return [(batch, params)]
    if galera_node(connection):
        return list(zip(batch.round_trips, batch.round_trip_parameters(params), strict=True))
    return [(batch.sql, params)]


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


def batch_execute(connection, cursor, batch: Transaction | str, params: Sequence[Any]) -> list[StatementResult]:
    """Run a multi-statement batch on a Django cursor (a Transaction in the round trips its server needs); return
    each statement's result.

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
        for statements, trip_params in _round_trips(connection, batch, params):
            cursor.execute(statements, trip_params)
    return results


def batch_row_counts(connection, batch: Transaction | str, params: Sequence[Any]) -> list[int]:
    """Run a multi-statement batch (or one statement) on its own cursor; return each statement's row count, raising
    the first error. For batches that read no rows, on a hot path (the credit award).

    A later statement's error reaches the client only when its result is read, so every result is read before this
    returns, inside the database error translation, and the batch fails as one statement. Where something wraps
    statements (an execute wrapper such as the SQL span, or the debug query log) or inside a transaction (a replay), it
    goes through Django's cursor, the results read inside the execute call, so a wrapper sees the whole batch too.
    """
    return [result.rowcount for result in _unread_batch(connection, batch, params)]


def batch_insert_ids(connection, batch: Transaction | str, params: Sequence[Any]) -> list[int]:
    """Run a multi-statement batch as batch_row_counts does; return the auto-increment key each statement generated
    (0 for a statement that generated none). For batches that read no rows, on a hot path (the order request)."""
    return [result.lastrowid or 0 for result in _unread_batch(connection, batch, params)]


def _unread_batch(connection, batch: Transaction | str, params: Sequence[Any]) -> list[StatementResult]:
    """Run a batch whose statements read no rows on the backend's own cursor, and return what each reported; through
    Django's cursor (batch_execute) where it must be (see batch_row_counts).

    Production takes both paths. The backend's own cursor: every order (orders/services.order_create runs only
    outside a transaction) and a worker's award. Django's cursor, each condition for a reason of its own:
    execute_wrappers, for core/tracing's SQL span when tracing is on, which must see the batch; queries_logged, for
    DEBUG's query log (a development server; a test's query capture turns it on too, so a test judging production's
    round trips records them at the driver instead: testkit/round_trips.py); in_atomic_block, for the award inside an
    admin's replay of a dead letter (credits/services.dead_letter_replay), whose savepoint Django's atomic manages.
    """
    if connection.execute_wrappers or connection.queries_logged or connection.in_atomic_block:
        with connection.cursor() as cursor:
            return batch_execute(connection, cursor, batch, params)
    # Otherwise on the backend's own cursor, opened the way connection.cursor() opens one (health check, connection,
    # thread check) but without Django's wrapper around it, which has nothing to do here and is work on every award:
    # creating, entering and closing it, and calling through it.
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    connection.validate_thread_sharing()
    with connection.wrap_database_errors:
        cursor = connection.create_cursor()
        try:
            results = []
            for statements, trip_params in _round_trips(connection, batch, params):
                cursor.execute(statements, trip_params)  # the backend's wrapper, which maps its integrity error codes
                results += _driver_results(cursor.cursor)
            return results
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
