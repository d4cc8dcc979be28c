"""What a connection sent its server, round trip by round trip, seen at the driver.

Django's query capture (CaptureQueriesContext) turns on the connection's debug cursor, and the hot writes' batches
then go through Django's cursor (core/sql_batches._unread_batch) instead of the backend's own, which production runs.
Recording at the driver's query() sees every round trip of whichever path runs, and changes none.
"""

import contextlib
from collections.abc import Iterator

from core.sql_batches import galera_node


@contextlib.contextmanager
def round_trips(connection) -> Iterator[list[str]]:
    """Yield a list that receives the SQL text of each query the connection's driver sends while the block runs.

    The connection is opened first, and its server asked once whether it is a Galera node (core/sql_batches): what a
    connection does once, not each write.
    """
    connection.ensure_connection()
    galera_node(connection)
    driver = connection.connection
    sent: list[str] = []
    real_query = driver.query

    def query(statement):
        sent.append(statement.decode() if isinstance(statement, bytes) else statement)
        return real_query(statement)

    driver.query = query
    try:
        yield sent
    finally:
        driver.query = real_query  # the driver's own again (its attributes cannot be deleted)


def statement_heads(sql: str) -> list[str]:
    """Return the start of each statement of a round trip: its first word, with the table of an INSERT."""
    return [" ".join(statement.split()[: 3 if statement.startswith("INSERT") else 1]) for statement in sql.split(";\n")]
