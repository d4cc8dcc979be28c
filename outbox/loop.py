"""The dedicated relay's loop: drain what is due, wait for the web's bell or poll less often while idle, back off
through outages."""

import logging
import math
import threading
import time

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connections

from core.worker import DB_CHECK_INTERVAL_SECONDS
from outbox.bell import Listener
from outbox.drain import BrokerUnavailable, drain
from outbox.outage import OutageLog, outage_backoff
from outbox.publisher import Publisher

logger = logging.getLogger(__name__)

IDLE_FIRST_SECONDS = 0.05
# A reconnection costs the broker or the database little, and every order waits for the relay to find it back: it
# tries at least this often, so it works again within seconds of an outage or a silence ending.
OUTAGE_BACKOFF_MAX_SECONDS = 5.0


def run_relay_loop(
    *,
    stop: threading.Event,
    publisher: Publisher | None = None,
    batch_size: int | None = None,
    idle_seconds: float | None = None,
    listener: Listener | None = None,
) -> int:
    """Relay until `stop` is set, finishing the batch in hand; return how many messages were published.

    Between drains it waits on the bell in Redis (outbox/bell.py), which the web rings after each commit (folded to
    one ring per OUTBOX_WAKE_INTERVAL_SECONDS), for up to OUTBOX_IDLE_SECONDS. While Redis does not answer it polls
    instead: 50 ms after a drain that published, doubling up to OUTBOX_IDLE_SECONDS while nothing is due. While the
    broker or the database is down it backs off up to OUTAGE_BACKOFF_MAX_SECONDS, warning once per outage and then
    once a minute. Its database connection is checked at most once a second, and at once after a
    database error.
    """
    publisher = publisher or Publisher()
    listener = listener or Listener()
    idle_max = idle_seconds or settings.OUTBOX_IDLE_SECONDS
    idle = IDLE_FIRST_SECONDS
    broker, database = OutageLog("broker", log=logger), OutageLog("database", log=logger)
    broker_failures = database_failures = 0
    total = 0
    checked_at = -math.inf
    try:
        while not stop.is_set():
            # Django's per-request connection check (CONN_MAX_AGE, a ping before use), at most once a second as in the
            # worker (core/worker.py): woken dozens of times a second, a ping per drain was a round trip per drain.
            checked = time.monotonic() - checked_at >= DB_CHECK_INTERVAL_SECONDS
            if checked:
                close_old_connections()
                checked_at = time.monotonic()
            try:
                published = drain(publisher, batch_size=batch_size, should_stop=stop.is_set)
            except BrokerUnavailable as exc:
                total += exc.published
                broker.failed(exc)
                broker_failures += 1
                stop.wait(outage_backoff(broker_failures, cap=OUTAGE_BACKOFF_MAX_SECONDS))
                continue
            except DatabaseError as exc:
                if not checked:
                    # The connection may have died while idle (the server restarted, or dropped it): check it and
                    # drain again at once, as the ping would have. A drain's first statement is its claim, so such a
                    # connection fails it before anything is published.
                    checked_at = -math.inf
                    continue
                publisher.close()
                database.failed(exc)
                database_failures += 1
                stop.wait(outage_backoff(database_failures, cap=OUTAGE_BACKOFF_MAX_SECONDS))
                continue
            broker.recovered()
            database.recovered()
            broker_failures = database_failures = 0
            total += published
            idle = IDLE_FIRST_SECONDS if published else min(idle * 2, idle_max)
            listener.wait(idle_max if listener.live else idle, stop)
    finally:
        listener.close()
        publisher.close()
        connections.close_all()
    return total
