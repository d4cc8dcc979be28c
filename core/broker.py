"""Connecting to the broker when CELERY_BROKER_URL names several nodes of a cluster ("amqp://h1;amqp://h2;...")."""

from kombu import Connection


def connection_ensure(conn: Connection, *, timeout: float | None = None) -> Connection:
    """Connect to the first node of the URL list that answers, trying each once, without sleeping in between.

    kombu moves on to the next node only from its retry loop, so a plain ``ensure_connection(max_retries=0)``
    tries the first node alone and fails while it is down, however many of the others are up. The caller owns the
    backoff between rounds, as before.
    """
    return conn.ensure_connection(
        max_retries=len(conn.alt) - 1 if conn.alt else 0,
        interval_start=0,
        interval_step=0,
        timeout=timeout,
    )
