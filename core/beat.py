"""Celery beat's scheduler: Celery's own, saving its schedule to its file, with a goodbye to the broker that ends.

Beat's SIGTERM handler saves the schedule, then closes the broker connection: an AMQP goodbye that waits for the
broker's answer. Beat's publishes wait for the broker's confirm (config/celery.py), so the signal usually lands while
beat reads that confirm, and the handler then reads the goodbye's answer on the same socket from inside that read. A
broker slow to answer, or a frame the interrupted read had half taken, kept beat waiting for ever (seen in CI: beat
still running 120 s after SIGTERM; tests/test_beat_stop.py reproduces it with a broker that withholds its replies).
Beat's own socket timeout (`--socket-timeout`, 30 s, a process-wide default) does not reach it: py-amqp sets the
connection's socket back to blocking once connected. The goodbye has GOODBYE_SECONDS in all; the schedule is saved
before it either way.

A schedule file beat cannot read is replaced by a fresh schedule, with a warning naming the file. A crash while beat
writes it can leave the index intact and the data file short or empty (shelve over dbm.dumb keeps them apart: FILE.dir,
FILE.dat, FILE.bak; dbm.gnu keeps one file), and reading an entry then raises EOFError, which Celery's own recovery
(PersistentScheduler.setup_schedule, _create_schedule) does not catch: beat would exit, and under Restart=always do so
for ever while the sweeper, retention and the nightly run wait. The schedule holds only the entries' last run times,
which beat_schedule rebuilds; losing them runs each entry once more, sooner than due, which every task here tolerates.
"""

import contextlib
import logging
import os

from celery.beat import PersistentScheduler

logger = logging.getLogger(__name__)

# Long enough for a loaded broker's answers (milliseconds when it is well), short beside a supervisor's stop timeout
# (creditshop-beat.service: 10 s).
GOODBYE_SECONDS = 5.0
# The answers the goodbye waits for, one after the other: the channel's Close-Ok, then the connection's. The socket's
# timeout bounds each read, so each gets its share of GOODBYE_SECONDS.
GOODBYE_REPLIES = 2


class Scheduler(PersistentScheduler):
    """PersistentScheduler that starts afresh from a schedule file it cannot read, and whose close gives the broker
    GOODBYE_SECONDS to answer, then drops the connection."""

    def setup_schedule(self) -> None:
        # Files present but no schedule in them (emptied): a fresh schedule too, which _create_schedule reports.
        self._had_files = any(os.path.exists(self.schedule_filename + suffix) for suffix in self.known_suffixes)
        try:
            super().setup_schedule()
        except Exception as exc:  # noqa: BLE001 (a fault that is not the file's recurs on the fresh file, and is raised)
            self._discard_schedule(repr(exc))
            super().setup_schedule()

    def _create_schedule(self) -> None:
        if self._had_files and "entries" not in self._store:
            self._warn_fresh("no schedule in it")
        super()._create_schedule()

    def _destroy_open_corrupted_schedule(self, exc: Exception):
        """Celery's hook for a file it cannot read: the same warning and a fresh file, opened."""
        self._discard_schedule(repr(exc))
        return self._open_schedule()

    def _discard_schedule(self, reason: str) -> None:
        """Close the store if open, remove the schedule's files and say so."""
        self._warn_fresh(reason)
        self._had_files = False
        store, self._store = self._store, None
        if store is not None:
            # Closed before its files go: an open store writes its index and cache back when it is collected. What it
            # would have written is removed next, so a failure to close is of no consequence.
            with contextlib.suppress(Exception):
                store.close()
        self._remove_db()

    def _warn_fresh(self, reason: str) -> None:
        logger.warning(
            "beat schedule file %s unusable (%s): starting with a fresh schedule", self.schedule_filename, reason
        )

    def close(self) -> None:
        # Celery keeps the connection in the instance's __dict__ once made (a cached property): asking for it by
        # attribute would open one just to close it.
        connection = self.__dict__.get("connection")
        if connection is not None and connection.connected:
            # A socket timeout ends the goodbye's reads and writes; Celery ignores the connection error it raises.
            connection.connection.sock.settimeout(GOODBYE_SECONDS / GOODBYE_REPLIES)
        super().close()
