"""Database faults injected into the test process's own connections (mocking only to inject a fault)."""

from django.db import OperationalError


def rollback_refused(monkeypatch, connection) -> None:
    """Make every ROLLBACK sent through Django's cursors fail as if the connection to the server was lost."""
    cursor_type = type(connection.cursor())
    real_execute = cursor_type.execute

    def execute(cursor, sql, params=None):
        if sql == "ROLLBACK":
            raise OperationalError(2013, "Lost connection to server during query (injected)")
        return real_execute(cursor, sql, params)

    monkeypatch.setattr(cursor_type, "execute", execute)
