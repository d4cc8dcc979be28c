"""Database faults: injected into the test process's own connections (mocking only to inject a fault), or done to a
server's connections from outside, as an operator or a timeout would."""

import MySQLdb
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


def killed_by_the_server(connection) -> int:
    """KILL `connection`'s session from another connection to the same server, as an operator or a timeout would;
    return the killed session's id. `connection` must be open."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT CONNECTION_ID()")
        (thread_id,) = cursor.fetchone()
    params = connection.get_connection_params()
    killer = MySQLdb.connect(**{k: params[k] for k in ("host", "port", "user", "password") if k in params})
    try:
        killer.cursor().execute(f"KILL CONNECTION {int(thread_id)}")
    finally:
        killer.close()
    return thread_id


def kill_database_connections(database: str) -> int:
    """KILL every server connection to a database except this process's own; return how many were killed."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT CONNECTION_ID()")
        (own,) = cursor.fetchone()
        cursor.execute("SELECT id FROM information_schema.processlist WHERE db = %s AND id <> %s", [database, own])
        ids = [row[0] for row in cursor.fetchall()]
        killed = 0
        for thread_id in ids:
            try:
                cursor.execute(f"KILL CONNECTION {int(thread_id)}")
                killed += 1
            except Exception:  # noqa: S110 (the connection may have closed on its own meanwhile)
                pass
    return killed
