"""The cheap teardown of a test whose writes commit (conftest.committed_db): it empties the tables holding rows.

A TransactionTestCase flushes after each test: a DELETE from every model table of each database, then post_migrate
makes the content types and permissions again. A test of an order writes a handful of tables; one query per database
finds the tables holding rows, and only those are emptied. What is left is what a flush leaves: every table empty but
the content types and permissions, which post_migrate made and no such test changes.
"""

import functools

from django.core.management.color import no_style
from django.db import connections
from django.test import TransactionTestCase

# The rows post_migrate makes, which a flush would delete and make again.
KEPT_TABLES = {"django_content_type", "auth_permission"}
_cheaply = False


def teardown_cheaply() -> None:
    """Make the current test case's teardown, which runs next, empty only the tables holding rows."""
    global _cheaply  # noqa: PLW0603 -- read by the test case's teardown, which runs after the fixture's
    _cheaply = True


@functools.cache
def flushed_tables(alias: str) -> tuple[str, ...]:
    """Return the model tables of a database a flush would empty, less the ones post_migrate fills."""
    names = connections[alias].introspection.django_table_names(only_existing=True, include_views=False)
    return tuple(sorted(set(names) - KEPT_TABLES))


def written_tables(alias: str) -> list[str]:
    """Return the tables of flushed_tables(alias) holding at least one row, in one query."""
    connection = connections[alias]
    qn = connection.ops.quote_name
    tables = flushed_tables(alias)
    # Table names from the models, quoted.
    found = " UNION ALL ".join(f"SELECT %s FROM DUAL WHERE EXISTS (SELECT 1 FROM {qn(table)})" for table in tables)  # noqa: S608
    with connection.cursor() as cursor:
        cursor.execute(found, tables)
        return [table for (table,) in cursor.fetchall()]


def rows_delete(alias: str) -> None:
    """Delete every row of the database's tables that hold any, as a flush deletes them (foreign keys unchecked)."""
    if written := written_tables(alias):
        connection = connections[alias]
        connection.ops.execute_sql_flush(connection.ops.sql_flush(no_style(), written))


def _fixture_teardown(test_case: TransactionTestCase) -> None:
    global _cheaply  # noqa: PLW0603
    if not _cheaply:
        return _flush(test_case)
    _cheaply = False
    for alias in test_case._databases_names(include_mirrors=False):
        rows_delete(alias)
    return None


# Every TransactionTestCase's teardown goes through here; one whose test asked for it deletes only what was written.
_flush = TransactionTestCase._fixture_teardown
TransactionTestCase._fixture_teardown = _fixture_teardown
