"""How long each process waits for a database, in one place: per role, applied when the process starts.

A dependency that goes silent (its packets dropped, no reset) leaves a socket waiting for as long as nothing bounds
it: TCP alone gives up on an open connection after about 15 minutes. Every database call therefore has a deadline,
chosen by what the process is for:

| role | who | connect | read, write | server-side statement limit | idle transaction ended | fails fast |
|---|---|---|---|---|---|---|
| web | gunicorn's workers (gunicorn.conf.py) | 2 s | 3 s | 2.5 s | no | yes: 1 s after a timeout (core/breaker.py) |
| relay | `relay_outbox` loop | 3 s | 20 s | 15 s | 20 s | no |
| worker | Celery workers of the outbox and credits queues | 3 s | 20 s | 15 s | 20 s | no |
| nightly | the analytics queue's worker, `run_nightly_reports`, Spark's JDBC reads | 5 s | 600 s | none | no | no |
| command | everything else: migrate, shell, the test run | 5 s | 3600 s | none | no | no |

The web answers every request within 5 s (a 201, or a 503 with Retry-After): one statement that gets no answer costs
3 s, a new connection 2 s, and once one thread has paid that the others fail fast instead (core/mysql/base.py). The
server-side limit (MariaDB's max_statement_time) stops a slow statement just before the client gives up on it, so
the server does not go on with work nobody waits for, and the client gets an error instead of a broken connection.
The idle transaction limit (MariaDB's idle_transaction_timeout) ends a relay's or worker's transaction whose client
is gone, and with it the row locks it held (WORKER_IDLE_TRANSACTION_SECONDS says why).
The relay's and the workers' statements take milliseconds (the award, a claim of OUTBOX_BATCH_SIZE rows, a retention
DELETE of OUTBOX_RETENTION_BATCH_SIZE rows); 20 s is far beyond them and short enough that a silent connection is
given up, and a new one made, well within the 15 s it takes the retransmissions of a connection that lived through a
long silence to resume after the network heals. The nightly worker plans its runs over a whole day of rows. Commands
run migrations, whose online DDL on a large table takes minutes. The broker's deadlines are config/celery.py's; Redis'
are the cache's options in config/settings.py; Spark's JDBC reads take theirs from analytics/extract.py.
"""

from dataclasses import dataclass

from django.db import connections

from core.env import env_int

WEB, RELAY, WORKER, NIGHTLY, COMMAND = "web", "relay", "worker", "nightly", "command"


@dataclass(frozen=True)
class Deadlines:
    """One role's database deadlines, in seconds (mysqlclient takes whole seconds)."""

    connect: int
    read: int
    write: int
    # MariaDB's max_statement_time; None: no server-side limit.
    statement: float | None
    # Seconds a process refuses new connections at once after one timed out or was refused; None: never fails fast.
    fail_fast: float | None = None
    # MariaDB's idle_transaction_timeout, whole seconds: the server ends a session whose open transaction has waited
    # that long for its next statement; None: never.
    idle_transaction: int | None = None

    def options(self) -> dict:
        """Return the DATABASES OPTIONS entries these deadlines set (MySQLdb.connect's arguments)."""
        return {"connect_timeout": self.connect, "read_timeout": self.read, "write_timeout": self.write}


# The relay's and the workers' read and write deadline. DATABASE_WORKER_READ_SECONDS exists for the fault-injection
# tests, which shorten it in the processes they start so that a silence crosses it in seconds; production keeps 20 s.
WORKER_READ_SECONDS = env_int("DATABASE_WORKER_READ_SECONDS", 20, minimum=2, maximum=600)
# The server stops a statement at three quarters of the client's wait: 15 s of 20.
WORKER_STATEMENT_SECONDS = WORKER_READ_SECONDS * 0.75

# The relay and the workers send each transaction as one batch, or statement after statement with nothing between
# (core/sql_batches.py), so a transaction of theirs left waiting for a statement longer than their read deadline has
# lost its client: a process that died, or a connection it gave up in a silence, whose close never reached the
# server. Until the server ends it, the transaction keeps its row locks (a user's balance row, an outbox row's claim):
# every award for that user waits and fails. Without this limit it would end at wait_timeout, 8 hours by default.
WORKER_IDLE_TRANSACTION_SECONDS = WORKER_READ_SECONDS

ROLES = {
    WEB: Deadlines(connect=2, read=3, write=3, statement=2.5, fail_fast=1.0),
    RELAY: Deadlines(
        connect=3,
        read=WORKER_READ_SECONDS,
        write=WORKER_READ_SECONDS,
        statement=WORKER_STATEMENT_SECONDS,
        idle_transaction=WORKER_IDLE_TRANSACTION_SECONDS,
    ),
    WORKER: Deadlines(
        connect=3,
        read=WORKER_READ_SECONDS,
        write=WORKER_READ_SECONDS,
        statement=WORKER_STATEMENT_SECONDS,
        idle_transaction=WORKER_IDLE_TRANSACTION_SECONDS,
    ),
    NIGHTLY: Deadlines(connect=5, read=600, write=600, statement=None),
    COMMAND: Deadlines(connect=5, read=3600, write=3600, statement=None),
}
# TCP keepalive on every database connection: an idle connection to a server gone silent is found dead (its socket
# reports the error the health check polls for: core/mysql/base.py) about 25 s after its last packet, not by the next
# request waiting out its read deadline.
KEEPALIVE_IDLE_SECONDS = 10
KEEPALIVE_INTERVAL_SECONDS = 5
KEEPALIVE_PROBES = 3

# The settings' own: any process that names no role.
DEFAULT_ROLE = COMMAND
# The key of a DATABASES entry that carries its fail-fast cooldown to the backend (core/mysql/base.py).
FAIL_FAST_KEY = "FAIL_FAST_SECONDS"


def init_command(base: str, deadlines: Deadlines) -> str:
    """Return the connection's init_command with the role's server-side limits appended: the statement limit and the
    idle transaction limit.

    Each is in a MariaDB executable comment: MariaDB runs it, MySQL (whose max_execution_time covers SELECTs only, and
    which has no idle transaction limit) reads a comment, so the same settings serve both.
    """
    command = base
    if deadlines.statement is not None:
        command += f" /*M!100108 , max_statement_time={deadlines.statement:g} */"
    if deadlines.idle_transaction is not None:
        command += f" /*M!100300 , idle_transaction_timeout={int(deadlines.idle_transaction)} */"
    return command


# The key of a DATABASES entry that keeps its init_command without the server-side limits, for a role to add its own.
INIT_COMMAND_KEY = "INIT_COMMAND_WITHOUT_LIMIT"


def database_settings(database: dict, role: str = DEFAULT_ROLE) -> None:
    """Set one DATABASES entry's deadlines to the role's, in place."""
    deadlines = ROLES[role]
    options = database["OPTIONS"]
    options.update(deadlines.options())
    base = database.setdefault(INIT_COMMAND_KEY, options.get("init_command", ""))
    options["init_command"] = init_command(base, deadlines)
    database[FAIL_FAST_KEY] = deadlines.fail_fast


def deadlines_apply(role: str) -> None:
    """Give every database connection of this process the role's deadlines; call before the first connection.

    A connection already open keeps the deadlines it was opened with until it is closed (CONN_MAX_AGE at most).
    """
    for alias in connections:
        database_settings(connections[alias].settings_dict, role)


def worker_deadlines_apply(sender=None, **kwargs) -> None:
    """Give a Celery worker its role's deadlines: the nightly one's if it consumes the analytics queue (celery's
    worker_init signal; its sender is the WorkController)."""
    from core.contract import ANALYTICS_QUEUE

    queues = set(sender.app.amqp.queues.consume_from) if sender is not None else set()
    deadlines_apply(NIGHTLY if ANALYTICS_QUEUE in queues else WORKER)
