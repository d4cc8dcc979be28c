"""Run the nightly Spark job: credit analytics and consistency checks for a day (or several), optionally repairing."""

import os
from datetime import timedelta

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from analytics import runs
from analytics.period import Period
from analytics.spark import spark_jvm_stop
from core.arguments import parse_day
from core.deadlines import NIGHTLY, deadlines_apply
from core.tracing import tracing_setup


class Command(BaseCommand):
    help = (
        "Compute credit analytics and run the consistency checks for --date (default: yesterday, UTC), writing "
        "$REPORTS_DIR/<date>/, the Parquet datasets and the report tables. Exits 0 when the job ran, even if "
        "checks found violations; non-zero only when the job failed or another run holds the date, and 75 "
        "(EX_TEMPFAIL) when SIGTERM interrupted it (recorded as interrupted; run it again)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--date", type=parse_day, default=None, help="the day to report, YYYY-MM-DD (UTC)")
        parser.add_argument(
            "--days", type=int, default=1, help="report this many days ending on --date in one job (a backfill)"
        )
        parser.add_argument(
            "--repair",
            action="store_true",
            help="re-enqueue the messages behind missing credits and stuck outbox rows (through the outbox)",
        )

    def handle(self, *args, **options):
        days = options["days"]
        if days < 1 or days > 366:
            raise CommandError("--days must be between 1 and 366")
        # A database that goes silent fails the run at the nightly role's read deadline instead of holding it until
        # ANALYTICS_RUN_TIMEOUT_SECONDS (core/deadlines.py).
        deadlines_apply(NIGHTLY)
        tracing_setup(service_name="creditshop-analytics", sql=settings.TRACING_SQL_SPANS)
        period = Period.ending(options["date"] or timezone.now().date() - timedelta(days=1), days=days)
        try:
            with runs.interrupt_on_sigterm(on_signal=spark_jvm_stop):
                outcome = runs.nightly_run(
                    period=period,
                    repair=options["repair"],
                    write=self._progress,
                    # Spark's own start-up warnings only when asked for: -v 2.
                    verbose=options["verbosity"] > 1,
                )
        except BaseException as exc:
            # Interrupted, whatever error surfaced first (Spark's, once its JVM was stopped): exit 75, run it again.
            if isinstance(exc, runs.RunInterrupted) or runs.interrupted():
                spark_jvm_stop()
                raise CommandError(
                    "nightly run interrupted by SIGTERM; run it again for the same date", returncode=os.EX_TEMPFAIL
                ) from None
            if isinstance(exc, runs.RunLocked):
                raise CommandError(str(exc)) from None
            if isinstance(exc, Exception):
                raise CommandError(f"nightly run failed: {exc.__class__.__name__}: {exc}") from exc
            raise
        for day in outcome.days:
            verdict = "ok" if day.ok else f"{day.violations:,} violations"
            found = ", ".join(f"{name}={o.count:,}" for name, o in day.checks.items() if o.count)
            repaired = f"; re-enqueued {day.repair.reenqueued}" if day.repair else ""
            self.stdout.write(f"{day.date}: {verdict}{' (' + found + ')' if found else ''}{repaired}")
        run = outcome.run
        self.stdout.write(f"run #{run.pk} succeeded in {run.duration_seconds:.1f}s; reports in {settings.REPORTS_DIR}")

    def _progress(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()
