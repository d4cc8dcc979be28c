"""Wake-ups: after an order commits, tell a relay that rows are waiting: ring a live relay loop's bell in Redis
(outbox/bell.py), or else send an ``outbox.relay`` task.

The hook runs in the request thread, so there it only sets a flag. One background thread per process sends the task.
Wake-ups that arrive while a send is in flight, or within OUTBOX_WAKE_INTERVAL_SECONDS of the previous send, fold
into one trailing send: a burst of orders becomes a few tasks, and every commit is still followed by a task sent
after it, so no row waits for the sweeper while the broker is up. While the broker is down the thread backs off
between attempts and wake-ups are dropped; the beat sweeper relays what they would have.

The interval also holds across processes and hosts: before sending, a thread takes a gate in the shared cache (SET NX
with the interval as its expiry). While another process holds it, that process's send is under way or was made
less than an interval ago, so this one tries again once the gate has expired: still a send after every commit, but
at most one per interval for the whole web tier. Without the gate, four gunicorn workers under load sent up to four
wake-ups per interval, each a worker's drain of a few rows: in bench_orders.py such wake-ups about double the whole
host's CPU per order. The same script
that takes the gate rings the bell when a relay loop listens (one round trip either way); a task is sent only when
none does. When the cache does not answer, the thread sends a task anyway.

Under sustained load (OUTBOX_WAKE_BUSY_RATE orders a second across the tier) the gate is taken for
OUTBOX_WAKE_BUSY_INTERVAL_SECONDS instead; outbox/bell.py says how the rate is counted and what it saves.
"""

import functools
import json
import logging
import os
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

from celery import current_app as app
from django.conf import settings
from kombu import Producer
from redis.exceptions import RedisError

from core.backoff import backoff_delay
from core.broker import BROKER_ERRORS, close_connection, connection_ensure
from core.contract import OUTBOX_QUEUE, RELAY_TASK
from outbox.bell import Ring, ring
from outbox.outage import OutageLog

logger = logging.getLogger(__name__)

# A wake-up that waited this long in the queue (workers down) is worthless: the sweeper has run since.
WAKE_EXPIRES_SECONDS = 60
SEND_TIMEOUT_SECONDS = 2.0
FAILURE_BACKOFF_FIRST, FAILURE_BACKOFF_MAX = 1.0, 30.0


def failure_backoff(failures: int) -> float:
    """Return how long the wake-up thread pauses after `failures` failed sends in a row (doubling, capped)."""
    return backoff_delay(failures - 1, base=FAILURE_BACKOFF_FIRST, cap=FAILURE_BACKOFF_MAX, jitter=False)


@functools.cache
def _wake_message() -> tuple[dict, str]:
    """Return the headers and JSON body of an ``outbox.relay`` task message, built once by Celery itself.

    Every wake-up is the same task with no arguments, so only its id and expiry change from one send to the next;
    going through send_task for each one costs about a millisecond of a web worker's CPU per wake-up.
    """
    message = app.amqp.as_task_v2("template", RELAY_TASK)
    headers = {**message.headers, "origin": f"wakeup@{os.uname().nodename}"}
    return headers, json.dumps(message.body)


class RelayWaker:
    """Coalescing waker of the relays, safe to call from any thread of any process.

    ``rung`` counts bells rung, ``sent`` relay tasks sent.
    """

    def __init__(
        self,
        *,
        url: str | None = None,
        interval: float | None = None,
        busy_interval: float | None = None,
        busy_rate: int | None = None,
        connect_timeout: float = 1.0,
    ):
        self.url = url
        self.interval = interval
        self.busy_interval = busy_interval
        self.busy_rate = busy_rate
        self.connect_timeout = connect_timeout
        self.rung = 0
        self.sent = 0
        self._event = threading.Event()
        self._start_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid: int | None = None
        self._conn = None
        self._producer: Producer | None = None
        self._outage = OutageLog("broker (relay wake-ups)", log=logger)
        self._failures = 0
        # Wake-ups (commits) since the thread last rang, reported to the web tier's rate. Incremented by request
        # threads and taken by this waker's thread without a lock: a lost increment only undercounts the rate.
        self._commits = 0

    def wake(self) -> None:
        """Ask for a relay task soon; returns at once and never raises."""
        self._commits += 1
        try:
            if self._pid != os.getpid() or self._thread is None or not self._thread.is_alive():
                self._start()
            self._event.set()
        except Exception:  # the order already committed; a lost wake-up only delays its message to the sweeper
            logger.exception("could not schedule a relay wake-up")

    def _start(self) -> None:
        with self._start_lock:
            if self._pid == os.getpid() and self._thread is not None and self._thread.is_alive():
                return
            if self._pid != os.getpid():
                # Forked: the parent's socket is not ours to use or close.
                self._conn = self._producer = None
                self._event = threading.Event()
            self._pid = os.getpid()
            self._thread = threading.Thread(target=self._run, name="outbox-wakeup", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        last_sent, gap = 0.0, 0.0
        while True:
            self._event.wait()
            wait = last_sent + gap - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            # Cleared before ringing or sending: a wake-up during either sets it again and gets its own, later, one.
            self._event.clear()
            outcome, gap = self._ring()
            if outcome is Ring.GATED:
                self._event.set()
                time.sleep(gap)  # another process woke the relays; once its gate has expired, this one follows
                continue
            last_sent = time.monotonic()
            if outcome is Ring.RUNG:
                self.rung += 1
                continue
            try:
                self._send()
            except BROKER_ERRORS as exc:
                self._drop_connection()
                self._outage.failed(exc)
                self._failures += 1
                time.sleep(failure_backoff(self._failures))
            except Exception:
                self._drop_connection()
                logger.exception("relay wake-up failed")
            else:
                self._failures = 0
                self._outage.recovered()

    def _ring(self) -> tuple[Ring, float]:
        """Ring a listening relay loop, or say a task is needed (none listens, or the cache is down), or gated; with
        how long the next ring must wait (the gate's interval, or what remains of another process's gate)."""
        interval = settings.OUTBOX_WAKE_INTERVAL_SECONDS if self.interval is None else self.interval
        busy_interval = settings.OUTBOX_WAKE_BUSY_INTERVAL_SECONDS if self.busy_interval is None else self.busy_interval
        busy_rate = settings.OUTBOX_WAKE_BUSY_RATE if self.busy_rate is None else self.busy_rate
        commits, self._commits = self._commits, 0
        try:
            return ring(interval=interval, commits=commits, busy_rate=busy_rate, busy_interval=busy_interval)
        except RedisError as exc:
            logger.debug("wake-up gate not available (%s); sending a task anyway", exc)
            return Ring.NO_LISTENER, interval

    def _send(self) -> None:
        if self._producer is None:
            timeouts = {"read_timeout": SEND_TIMEOUT_SECONDS, "write_timeout": SEND_TIMEOUT_SECONDS}
            conn = app.connection_for_write(
                url=self.url, connect_timeout=self.connect_timeout, heartbeat=0, transport_options=timeouts
            )
            try:
                connection_ensure(conn)
                producer = Producer(conn.default_channel)
                # Messages published below go straight to the exchange; make sure it and its queue exist.
                producer.maybe_declare(app.amqp.queues[OUTBOX_QUEUE])
                self._producer = producer
            except BaseException:
                close_connection(conn, graceful=False)
                raise
            self._conn = conn
        headers, body = _wake_message()
        task_id = str(uuid.uuid4())
        expires = datetime.now(UTC) + timedelta(seconds=WAKE_EXPIRES_SECONDS)
        # Confirmed like every publish on this connection (config/celery.py), so a broker outage is noticed here.
        self._producer.publish(
            body,
            exchange=OUTBOX_QUEUE,
            routing_key=OUTBOX_QUEUE,
            headers={**headers, "id": task_id, "root_id": task_id, "expires": expires.isoformat()},
            correlation_id=task_id,
            content_type="application/json",
            content_encoding="utf-8",
            # A wake-up is a hint the sweeper stands in for: not written to disk, and dropped by the broker itself
            # once stale rather than queued behind stopped workers.
            delivery_mode=1,
            expiration=WAKE_EXPIRES_SECONDS,
            retry=False,
            timeout=SEND_TIMEOUT_SECONDS,
            confirm_timeout=SEND_TIMEOUT_SECONDS,
        )
        self.sent += 1

    def _drop_connection(self) -> None:
        conn, self._conn, self._producer = self._conn, None, None
        if conn is not None:
            close_connection(conn, graceful=False)


waker = RelayWaker()
