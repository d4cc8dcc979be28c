"""``relay_outbox``: run a dedicated outbox relay, or with ``--once`` publish everything due now and exit."""

import signal
import threading

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from core.deadlines import RELAY, deadlines_apply
from core.tracing import tracing_setup
from outbox.drain import BrokerUnavailable, drain
from outbox.loop import run_relay_loop
from outbox.publisher import Publisher


class Command(BaseCommand):
    help = "Publish due outbox rows to RabbitMQ. Loops until SIGTERM/SIGINT; --once drains what is due and exits."
    # System checks import the URLconf and with it the whole API, slowing every start; a relay needs none of it, and
    # `manage.py check` runs in CI.
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="Publish everything due now, print the count, exit.")
        parser.add_argument("--batch-size", type=int, default=None, help="Rows per claim (default OUTBOX_BATCH_SIZE).")

    def handle(self, *args, once: bool, batch_size: int | None, **options):
        if batch_size is not None and batch_size < 1:
            raise CommandError("--batch-size must be at least 1")
        deadlines_apply(RELAY)
        tracing_setup(service_name="creditshop-relay", sql=settings.TRACING_SQL_SPANS)
        if once:
            self._once(batch_size)
        else:
            self._loop(batch_size)

    def _once(self, batch_size: int | None) -> None:
        publisher = Publisher()
        try:
            published = drain(publisher, batch_size=batch_size)
        except BrokerUnavailable as exc:
            raise CommandError(f"broker unavailable after publishing {exc.published}: {exc}") from exc
        finally:
            publisher.close()
        self.stdout.write(f"published {published}")

    def _loop(self, batch_size: int | None) -> None:
        stop = threading.Event()
        # The loop runs in its own thread; the main thread only waits, so the signal handler never interrupts a
        # batch (it finishes, then the loop sees the flag) and never contends with the loop for the event's lock.
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        result = {}
        worker = threading.Thread(
            target=lambda: result.update(published=run_relay_loop(stop=stop, batch_size=batch_size)),
            name="outbox-relay",
        )
        worker.start()
        # On stderr: stdout carries the result alone (`stopped; published N`).
        self.stderr.write("relaying; SIGTERM or SIGINT stops it once the batch in hand is confirmed and marked")
        self.stderr.flush()
        while worker.is_alive():
            worker.join(0.5)
        if "published" not in result:
            raise CommandError("the relay loop failed; see the log above")
        self.stdout.write(f"stopped; published {result['published']}")
