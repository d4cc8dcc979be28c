"""The least a Spark run must do before any check: what a nightly run costs that no choice of checks can win back.

Any Spark job that pairs a day's orders with their outbox rows and credits has to start Django and the JVM, plan
the read window, read the three tables over JDBC and bring each order's rows together (a shuffle by order id). This
script does exactly that, the job's way (analytics.jobs' window, extract's reads, the session and tuning a run
uses), then pairs the cached frames once: the job's missing-credit check (analytics.checks), counted before any
look-up. It runs no other check, no analytics and writes nothing. Run by bench_analytics.py --floor beside the job
and the baseline, in a process of its own, so the time a run spends above this floor is measured in the same round:

    python bench/analytics_floor.py --date YYYY-MM-DD [--days N]

prints one JSON line: the wall and this process's CPU seconds of each part (from the process's start), the rows of
each frame, and the orders the check names.
"""

import time

STARTED = time.monotonic()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from datetime import date  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.utils import timezone  # noqa: E402

from analytics import extract, jdbc  # noqa: E402
from analytics.checks import CheckContext, check_missing_credit  # noqa: E402
from analytics.jobs import partition_by_order, window_bounds  # noqa: E402
from analytics.lookups import count_together  # noqa: E402
from analytics.period import Period  # noqa: E402
from analytics.spark import spark_session, tuning_for  # noqa: E402


class Parts:
    """Wall and CPU seconds per part, each from the end of the one before (the first from the process's start)."""

    def __init__(self) -> None:
        self.parts: dict[str, dict[str, float]] = {}
        self._wall, self._cpu = STARTED, 0.0

    def done(self, name: str) -> None:
        wall, cpu = time.monotonic(), time.process_time()
        self.parts[name] = {
            "wall_seconds": round(wall - self._wall, 2),
            "python_cpu_seconds": round(cpu - self._cpu, 2),
        }
        self._wall, self._cpu = wall, cpu


def floor(end: date, days: int) -> dict:
    """Read, shuffle, cache and pair the `days` days ending on `end` the job's way; return each part's time."""
    parts = Parts()
    parts.done("python and django")
    period = Period.ending(end, days=days)
    sources = jdbc.sources()
    plan = extract.plan_window(sources, **window_bounds(period))
    parts.done("plan the window")
    with spark_session(tuning=tuning_for(plan.orders.rows)) as spark:
        parts.done("spark session")
        data = partition_by_order(extract.extract_window(spark, sources, plan))
        rows = count_together({"orders": data.orders, "logs": data.logs, "credits": data.credits})
        parts.done("read, shuffle by order id, cache")
        ctx = CheckContext(period=period, as_of=timezone.now(), grace_seconds=settings.CONSISTENCY_GRACE_SECONDS)
        uncredited = check_missing_credit(data.orders, data.credits, ctx).count()
        parts.done("pair orders with credits once")
    parts.done("stop the session")
    return {"parts": parts.parts, "rows": rows, "uncredited": uncredited}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--date", type=date.fromisoformat, required=True, help="the last day read")
    parser.add_argument("--days", type=int, default=1)
    args = parser.parse_args()
    print(json.dumps(floor(args.date, args.days)))


if __name__ == "__main__":
    main()
