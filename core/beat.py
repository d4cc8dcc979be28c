"""Celery beat's scheduler: Celery's own, saving its schedule to its file, with a goodbye to the broker that ends.

Beat's SIGTERM handler saves the schedule, then closes the broker connection: an AMQP goodbye that waits for the
broker's answer. Beat's publishes wait for the broker's confirm (config/celery.py), so the signal usually lands while
beat reads that confirm, and the handler then reads the goodbye's answer on the same socket from inside that read. A
broker slow to answer, or a frame the interrupted read had half taken, kept beat waiting for ever (seen in CI: beat
still running 120 s after SIGTERM; tests/test_beat_stop.py reproduces it with a broker that withholds its replies).
Beat's own socket timeout (`--socket-timeout`, 30 s, a process-wide default) does not reach it: py-amqp sets the
connection's socket back to blocking once connected. The goodbye now has GOODBYE_SECONDS; the schedule is saved
before it either way.
"""

from celery.beat import PersistentScheduler

# Long enough for a loaded broker's answer (milliseconds when it is well), short beside a supervisor's stop timeout.
GOODBYE_SECONDS = 5.0


class Scheduler(PersistentScheduler):
    """PersistentScheduler whose close gives the broker GOODBYE_SECONDS to answer, then drops the connection."""

    def close(self) -> None:
        # Celery keeps the connection in the instance's __dict__ once made (a cached property): asking for it by
        # attribute would open one just to close it.
        connection = self.__dict__.get("connection")
        if connection is not None and connection.connected:
            # A socket timeout ends the goodbye's reads and writes; Celery ignores the connection error it raises.
            connection.connection.sock.settimeout(GOODBYE_SECONDS)
        super().close()
