"""Connecting to the broker (CELERY_BROKER_URL may name several nodes: "amqp://h1;amqp://h2;..."), and letting go."""

import logging

from amqp.exceptions import AMQPError
from kombu import Connection
from kombu.exceptions import OperationalError

logger = logging.getLogger(__name__)

# What a lost or refused broker connection raises: kombu wraps connect failures, py-amqp raises protocol errors,
# and socket failures (refused, reset, timed out) are OSErrors.
BROKER_ERRORS = (OperationalError, AMQPError, OSError)


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


def close_connection(conn, *, graceful: bool = True, timeout: float = 2.0) -> None:
    """Close a kombu connection without ever blocking on a broker that stopped answering.

    The AMQP close handshake waits for the broker's reply with no time limit, so it is bounded here, and skipped
    (the socket is just closed) when the connection already failed.
    """
    try:
        if graceful and conn.connected:
            conn.connection.transport.sock.settimeout(timeout)
            conn.release()
            return
    except (*BROKER_ERRORS, AttributeError):
        logger.debug("graceful close of a broker connection failed", exc_info=True)
    try:
        conn.collect()
    except (*BROKER_ERRORS, AttributeError):
        logger.debug("error dropping a broker connection", exc_info=True)
