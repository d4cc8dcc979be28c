"""Django's MySQL/MariaDB backend with a health check that costs no round trip, and failing fast while the server is
silent (DATABASES' ENGINE, config/settings.py).

With CONN_HEALTH_CHECKS a connection reused by a new request (or, in the workers, at most once a second: core/worker.py)
is checked first, so a connection the server closed (KILL, wait_timeout, a restart) heals instead of failing the
request. Django checks with a ping: a round trip to the server before every order, CPU on both sides for an answer
the socket already holds. Between statements nothing is due from the server on an idle connection, so a connection it
closed is one whose socket is readable: its end of file, or the error packet MariaDB sends before closing, is waiting.
A poll of the socket answers that without a round trip. It does not see a peer that vanished without
closing (a host powered off, a network that drops packets); such a connection fails its next statement at the read
deadline (core/deadlines.py) and is closed as any failed connection is.

Where the process's role fails fast (the web: core/deadlines.py), one timed-out or refused connection opens the
alias' breaker (core/breaker.py): for its cooldown every thread's connection is dropped at its next health check and
new connections are refused at once, so the threads answer 503 instead of each waiting out the deadline; then one
thread at a time tries a real connection, and the first that gets one closes the breaker.
"""

import select
import socket
import threading

import MySQLdb
from django.db.backends.mysql import base
from django.db.utils import DatabaseErrorWrapper
from django.utils.functional import cached_property

from core.breaker import Breaker
from core.deadlines import FAIL_FAST_KEY, KEEPALIVE_IDLE_SECONDS, KEEPALIVE_INTERVAL_SECONDS, KEEPALIVE_PROBES

# Client error codes meaning the server did not answer in time or could not be reached at all.
SILENCE_ERRORS = frozenset(
    {
        2002,  # CR_CONNECTION_ERROR: cannot connect (refused, or timed out: errno 110)
        2003,  # CR_CONN_HOST_ERROR: cannot connect to the host
        2006,  # CR_SERVER_GONE_ERROR
        2013,  # CR_SERVER_LOST: lost connection during a query (the read deadline passed)
        2055,  # CR_SERVER_LOST_EXTENDED
    }
)


class DatabaseNotAnswering(MySQLdb.OperationalError):
    """A connection refused without trying, while the alias' breaker is open (Django raises it as OperationalError)."""


# One breaker per alias, shared by every thread of the process.
_breakers: dict[str, Breaker] = {}
_breakers_lock = threading.Lock()


def breaker_for(alias: str, cooldown: float) -> Breaker:
    """Return the process's breaker of a database alias (made on first use)."""
    breaker = _breakers.get(alias)
    if breaker is None:
        with _breakers_lock:
            breaker = _breakers.setdefault(alias, Breaker(f"database {alias}", cooldown=cooldown))
    return breaker


def breakers_reset() -> None:
    """Close every database breaker of this process (tests)."""
    for breaker in list(_breakers.values()):
        breaker.reset()


def is_silence(exc: BaseException) -> bool:
    """Return whether a driver error means the server did not answer, or could not be reached (not a refusal of the
    breaker's own, which would keep it open for ever)."""
    return bool(exc.args) and exc.args[0] in SILENCE_ERRORS and not isinstance(exc, DatabaseNotAnswering)


class SilenceAwareErrorWrapper(DatabaseErrorWrapper):
    """Django's error translation, telling the alias' breaker when a statement found the server silent."""

    def __exit__(self, exc_type, exc_value, traceback):
        if exc_type is not None and (breaker := self.wrapper.breaker) is not None and is_silence(exc_value):
            breaker.failed()
        return super().__exit__(exc_type, exc_value, traceback)


def keepalive_set(connection) -> None:
    """Turn TCP keepalive on for a new driver connection over TCP (mysqlclient has no option for it): set on a duplicate
    of its descriptor, which shares the socket."""
    with socket.socket(fileno=socket.dup(connection.fileno())) as sock:
        if sock.family not in (socket.AF_INET, socket.AF_INET6):  # a Unix socket: nothing in between to go silent
            return
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE_SECONDS)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL_SECONDS)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_PROBES)


class DatabaseWrapper(base.DatabaseWrapper):
    @property
    def breaker(self) -> Breaker | None:
        """Return the alias' breaker where this process fails fast (the web), else None."""
        cooldown = self.settings_dict.get(FAIL_FAST_KEY)
        return None if cooldown is None else breaker_for(self.alias, cooldown)

    @cached_property
    def wrap_database_errors(self):
        return SilenceAwareErrorWrapper(self)

    def get_new_connection(self, conn_params):
        connection = self._connection_open(conn_params)
        keepalive_set(connection)
        return connection

    def _connection_open(self, conn_params):
        breaker = self.breaker
        if breaker is None:
            return super().get_new_connection(conn_params)
        if not breaker.allow():
            raise DatabaseNotAnswering(
                2003, f"the {self.alias} database did not answer just now; not waiting for it again yet"
            )
        try:
            connection = super().get_new_connection(conn_params)
        except self.Database.OperationalError as exc:
            if is_silence(exc):
                breaker.failed()
            else:  # it answered (a refused login, say)
                breaker.succeeded()
            raise
        except BaseException:
            breaker.succeeded()
            raise
        breaker.succeeded()
        return connection

    def is_usable(self) -> bool:
        """Return whether the open connection may be used: nothing the server sent unasked waits on its socket, and
        the server has not just been found silent by another thread."""
        breaker = self.breaker
        if breaker is not None and not breaker.closed:
            return False
        try:
            descriptor = self.connection.fileno()
        except self.Database.Error:  # closed on this side
            return False
        poller = select.poll()
        poller.register(descriptor, select.POLLIN | select.POLLPRI)
        return not poller.poll(0)  # POLLHUP and POLLERR are reported whatever the mask
