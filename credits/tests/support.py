"""Helpers for the credits tests: orders with their messages, faults injected in MariaDB, real Celery workers."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

from django.conf import settings
from django.db import connections
from kombu import Connection

from config.celery import app
from core.contract import CREDITS_DEAD_QUEUE, CREDITS_EXPIRED_QUEUE, CREDITS_QUEUE, SCHEMA_VERSIONS, credits_queue_name
from orders.services import order_create
from outbox.claims import ClaimedMessage
from outbox.models import TransactionLog
from outbox.publisher import Publisher
from testkit.processes import service_env, stop_processes
from testkit.waiting import wait_for

CREDITS = "credits"


def place_order(*, user, total: int = 3) -> tuple[int, dict]:
    """Place an order the normal way and return its id and the transaction_log payload the relay would publish."""
    order = order_create(user=user, goods_name="widget", total=total).order
    return order.pk, TransactionLog.objects.get(pk=order.transaction_id).payload


def publish(*payloads: dict) -> None:
    """Publish credits messages through the relay's own publisher, in one batch, and require the broker's confirms.

    The messages are the relay's own (outbox/messages.py), headers and all, as the workers receive them in production.
    """
    messages = [ClaimedMessage(id=payload["transaction_id"], payload=payload, attempts=0) for payload in payloads]
    publisher = Publisher()
    try:
        result = publisher.publish(messages)
    finally:
        publisher.close()
    assert len(result.confirmed) == len(messages), result.failed or result.broker_error


# --- the broker ---------------------------------------------------------------------------------------------------


def broker_reset() -> None:
    """Declare the credits queues, one per version, and the dead-letter route, and empty them."""
    versions = [credits_queue_name(version) for version in SCHEMA_VERSIONS if version > 1]
    with Connection(settings.CELERY_BROKER_URL) as conn:
        channel = conn.default_channel
        for name in (CREDITS_QUEUE, *versions, CREDITS_EXPIRED_QUEUE, CREDITS_DEAD_QUEUE):
            queue = app.amqp.queues[name].bind(channel)
            queue.declare()
            queue.purge()


def queue_take(name: str) -> list[dict]:
    """Remove and return every ready message in a queue as {"headers", "args", "kwargs", "properties"}."""
    taken = []
    with Connection(settings.CELERY_BROKER_URL) as conn:
        channel = conn.default_channel
        while (message := channel.basic_get(name, no_ack=True)) is not None:
            args, kwargs, _embed = json.loads(message.body)
            taken.append({"headers": message.headers, "args": args, "kwargs": kwargs, "properties": message.properties})
    return taken


def dead_queue_take() -> list[dict]:
    """Remove and return every message in credits.dead as {"headers", "args", "kwargs"}."""
    return queue_take(CREDITS_DEAD_QUEUE)


def queue_depth(name: str) -> int:
    """Return how many ready (not yet delivered) messages a queue holds."""
    with Connection(settings.CELERY_BROKER_URL) as conn:
        return app.amqp.queues[name].bind(conn.default_channel).queue_declare(passive=True).message_count


def queue_unacknowledged(name: str) -> int:
    """Return how many of a queue's messages a consumer holds, delivered and not yet acknowledged (rabbitmqctl)."""
    vhost = unquote(urlsplit(settings.CELERY_BROKER_URL.split(";")[0]).path[1:]) or "/"
    listing = subprocess.run(
        ["rabbitmqctl", "-q", "list_queues", "--no-table-headers", "-p", vhost, "name", "messages_unacknowledged"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0] == name and fields[1].isdigit():
            return int(fields[1])
    return 0


# --- faults injected at the database ------------------------------------------------------------------------------


class DatabaseFaults:
    """A trigger on order_credits that, per order, logs each insert attempt, can pause it, and can refuse it.

    The control and log tables are MyISAM on purpose: their rows survive the rollback of the failing transaction.
    The trigger's statement holds table locks on both until it ends (pause included): see a
    paused insert with `pausing`, and expect `clear` to wait for it.
    A refusal is a deadlock error (1213) signalled by the trigger, which the retry policy treats as transient.
    """

    def install(self) -> None:
        with connections[CREDITS].cursor() as cursor:
            self._drop(cursor)
            cursor.execute(
                "CREATE TABLE credit_test_faults (order_id BIGINT PRIMARY KEY, remaining INT NOT NULL,"
                " sleep_seconds DOUBLE NOT NULL DEFAULT 0) ENGINE=MyISAM"
            )
            cursor.execute(
                "CREATE TABLE credit_test_attempts (id BIGINT AUTO_INCREMENT PRIMARY KEY, order_id BIGINT NOT NULL,"
                " connection_id BIGINT NOT NULL, at DATETIME(6) NOT NULL) ENGINE=MyISAM"
            )
            cursor.execute(
                """
                CREATE TRIGGER credit_test_fault BEFORE INSERT ON order_credits FOR EACH ROW
                BEGIN
                  DECLARE refuse INT DEFAULT 0;
                  DECLARE pause DOUBLE DEFAULT 0;
                  SELECT COALESCE(MAX(remaining > 0), 0), COALESCE(MAX(sleep_seconds), 0) INTO refuse, pause
                    FROM credit_test_faults WHERE order_id = NEW.order_id;
                  INSERT INTO credit_test_attempts (order_id, connection_id, at)
                    VALUES (NEW.order_id, CONNECTION_ID(), UTC_TIMESTAMP(6));
                  IF pause > 0 THEN DO SLEEP(pause); END IF;
                  IF refuse THEN
                    UPDATE credit_test_faults SET remaining = remaining - 1 WHERE order_id = NEW.order_id;
                    SIGNAL SQLSTATE '40001' SET MYSQL_ERRNO = 1213, MESSAGE_TEXT = 'injected: insert refused';
                  END IF;
                END
                """
            )

    def remove(self) -> None:
        with connections[CREDITS].cursor() as cursor:
            self._drop(cursor)

    @staticmethod
    def _drop(cursor) -> None:
        cursor.execute("DROP TRIGGER IF EXISTS credit_test_fault")
        cursor.execute("DROP TABLE IF EXISTS credit_test_faults, credit_test_attempts")

    def set(self, order_id: int, *, refuse: int = 0, sleep: float = 0.0) -> None:
        """Refuse the next `refuse` inserts of this order's credit, and pause every one for `sleep` seconds."""
        with connections[CREDITS].cursor() as cursor:
            cursor.execute(
                "REPLACE INTO credit_test_faults (order_id, remaining, sleep_seconds) VALUES (%s, %s, %s)",
                [order_id, refuse, sleep],
            )

    def clear(self, order_id: int) -> None:
        with connections[CREDITS].cursor() as cursor:
            cursor.execute("DELETE FROM credit_test_faults WHERE order_id = %s", [order_id])

    def pausing(self) -> list[int]:
        """Return the connection ids of inserts paused in the trigger right now, inside their award transaction."""
        with connections[CREDITS].cursor() as cursor:
            # The process list shows the trigger's own statement while it runs, not the INSERT.
            cursor.execute(
                "SELECT ID FROM information_schema.PROCESSLIST"
                " WHERE DB = DATABASE() AND STATE = 'User sleep' AND INFO LIKE 'DO SLEEP%'"
            )
            return [row[0] for row in cursor.fetchall()]

    def kill_connection(self, connection_id: int) -> None:
        """Drop a client's connection from the server side, as a server restart or a network cut would."""
        with connections[CREDITS].cursor() as cursor:
            cursor.execute("KILL CONNECTION %s", [connection_id])

    def attempts(self, order_id: int) -> list[tuple[int, object]]:
        """Return (connection id, time) of every insert attempt for the order's credit, oldest first."""
        with connections[CREDITS].cursor() as cursor:
            cursor.execute(
                "SELECT connection_id, at FROM credit_test_attempts WHERE order_id = %s ORDER BY id", [order_id]
            )
            return list(cursor.fetchall())


# --- real Celery workers ------------------------------------------------------------------------------------------


class Worker:
    """A `celery -A config worker -Q credits` subprocess on the test database, in its own process group."""

    def __init__(self, name: str, log_dir: Path, *, concurrency: int = 1, env: dict | None = None):
        self.name = name
        self.concurrency = concurrency
        self.log_path = log_dir / f"{name}.log"
        self.env = env or {}
        self.process: subprocess.Popen | None = None

    def start(self, *, timeout: float = 60.0) -> "Worker":
        env = service_env(**self.env)
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "config",
            "worker",
            "-Q",
            CREDITS_QUEUE,
            "-c",
            str(self.concurrency),
            "-n",
            f"{self.name}@%h",
            "--without-mingle",
            "--without-gossip",
            "--loglevel",
            "INFO",
        ]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                command,
                cwd=settings.BASE_DIR,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(lambda: self._ready(), timeout=timeout, what=f"worker {self.name} to be ready")
        return self

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"worker {self.name} exited with {self.process.returncode}:\n{self.log()[-3000:]}")
        return " ready." in self.log()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def count(self, pattern: str) -> int:
        return len(re.findall(pattern, self.log()))

    def pool_pids(self) -> list[int]:
        """Return the pids of the prefork pool's child processes."""
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split()
        return [int(pid) for pid in children]

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send a signal to the whole worker (main process and pool) and wait for the main process to go."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        """Stop the worker: a warm shutdown, then SIGKILL to the whole group for anything left."""
        if self.process is not None:
            stop_processes(self.process, grace=15, group=True)
