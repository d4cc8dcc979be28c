"""The nightly checks without Spark, as a person would write them: SQL per database, the pairing across both in Python.

Orders and outbox rows are in one database, credits in another (possibly on another server), so the checks that
pair an order with its credit or dead letter cannot be one SQL query. The baseline does what a person without
Spark would: one query per side (each database reads its own rows of the window, plus the rows of the other
side's ids found outside it), and the pairing in Python. The checks within one side stay single SQL queries on
that side's database.

Run by bench_analytics.py in a process of its own, so its CPU time and peak memory are its own:

    python bench/analytics_baseline.py --date YYYY-MM-DD [--days N]

prints one JSON line: the violations per check, the wall and CPU time of each part, and the peak RSS.
"""

import argparse
import json
import os
import sys
import time
from collections import Counter
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.db import connections  # noqa: E402

from analytics.checks import CHECK_NAMES  # noqa: E402
from analytics.period import Period  # noqa: E402
from bench.proc_stats import peak_rss_bytes  # noqa: E402

# Ids per IN (...) list when the baseline looks up the other side's rows by id.
LOOKUP_CHUNK = 1_000
# Rows per fetch when streaming the window's orders.
FETCH_ROWS = 10_000

# The checks within one database, per day, keyed by the database alias; {start} {end} {cutoff} are UTC DATETIME
# literals, and {collation} is foreign_key's, so comparing it with the order id as text can use the unique index.
SQL_CHECKS = {
    "default": {
        "order_without_log": """
            SELECT DATE(o.created_at), COUNT(*) FROM orders o
            WHERE o.created_at >= '{start}' AND o.created_at < '{end}'
              AND NOT EXISTS (SELECT 1 FROM transaction_log l
                              WHERE l.business = 'order' AND l.foreign_key = CAST(o.id AS CHAR) COLLATE {collation})
            GROUP BY 1""",
        "log_without_order": """
            SELECT DATE(l.created_at), COUNT(*) FROM transaction_log l
            WHERE l.business = 'order' AND l.created_at >= '{start}' AND l.created_at < '{end}'
              AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.id = CAST(l.foreign_key AS UNSIGNED))
            GROUP BY 1""",
        "stuck_outbox": """
            SELECT DATE(created_at), COUNT(*) FROM transaction_log
            WHERE business = 'order' AND created_at >= '{start}' AND created_at < '{end}'
              AND created_at < '{cutoff}' AND status NOT IN ('published', 'discarded')
            GROUP BY 1""",
    },
    "credits": {
        "duplicate_credit": """
            SELECT DATE(latest), COUNT(*) FROM (
              SELECT c.order_id, MAX(c.created_at) AS latest FROM order_credits c
              WHERE c.order_id IN (SELECT order_id FROM order_credits
                                   WHERE created_at >= '{start}' AND created_at < '{end}')
              GROUP BY c.order_id HAVING COUNT(*) > 1) d
            WHERE latest >= '{start}' AND latest < '{end}'
            GROUP BY 1""",
    },
}


def _literal(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def sql_baseline(end: date, days: int) -> dict:
    """Run every check without Spark over the `days` days ending on `end`; return the violations and the time taken."""
    period = Period.ending(end, days=days)
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT collation_name FROM information_schema.columns"
            " WHERE table_schema = DATABASE() AND table_name = 'transaction_log' AND column_name = 'foreign_key'"
        )
        (collation,) = cursor.fetchone()
    cutoff = datetime.now(UTC) - timedelta(seconds=settings.CONSISTENCY_GRACE_SECONDS)
    values = {
        "start": _literal(period.start),
        "end": _literal(period.end),
        "cutoff": _literal(cutoff),
        "collation": collation,
    }
    found = dict.fromkeys(CHECK_NAMES, 0)
    started, cpu_started = time.monotonic(), time.process_time()
    for alias, checks in SQL_CHECKS.items():
        with connections[alias].cursor() as cursor:
            for name, sql in checks.items():
                cursor.execute(sql.format(**values))
                found[name] = sum(count for _, count in cursor.fetchall())
    one_side, one_side_cpu = time.monotonic() - started, time.process_time() - cpu_started
    found.update(cross_database_checks(period, cutoff=cutoff))
    return {
        "wall_seconds": round(time.monotonic() - started, 2),
        "cpu_seconds": round(time.process_time() - cpu_started, 2),
        "found": found,
        "parts": {
            "sql_within_one_database": {"wall_seconds": round(one_side, 2), "cpu_seconds": round(one_side_cpu, 2)},
            "across_both_in_python": {
                "wall_seconds": round(time.monotonic() - started - one_side, 2),
                "cpu_seconds": round(time.process_time() - cpu_started - one_side_cpu, 2),
            },
        },
    }


def cross_database_checks(period: Period, *, cutoff: datetime) -> dict[str, int]:
    """Count the checks that pair orders with credits or dead letters: one query per side, the join in Python.

    The credits database gives the period's credits, which of the period's orders have a credit at all (a range on
    order_id, between the period's smallest and largest order id) and the open dead letters; the orders database
    gives the period's orders, streamed, and then the orders of credits whose order was placed outside the period.
    """
    window = [period.start, period.end]
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT MIN(id), MAX(id) FROM orders WHERE created_at >= %s AND created_at < %s", window)
        lowest, highest = cursor.fetchone()
    with connections["credits"].cursor() as cursor:
        cursor.execute(
            "SELECT id, order_id, total, ordered_at FROM order_credits WHERE created_at >= %s AND created_at < %s",
            window,
        )
        awarded = cursor.fetchall()
        credited: set[int] = set()
        if lowest is not None:
            cursor.execute("SELECT order_id FROM order_credits WHERE order_id BETWEEN %s AND %s", [lowest, highest])
            credited = {order_id for (order_id,) in cursor.fetchall()}
        cursor.execute("SELECT order_id FROM credit_dead_letters WHERE status = 'open' AND order_id IS NOT NULL")
        open_letters = Counter(order_id for (order_id,) in cursor.fetchall())
    wanted = {order_id for _, order_id, _, _ in awarded}
    placed: dict[int, tuple[int, datetime]] = {}
    missing = dead_letters_open = 0
    # A raw cursor returns DATETIME columns as naive UTC values.
    due_before = cutoff.astimezone(UTC).replace(tzinfo=None)
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT id, total, created_at FROM orders WHERE created_at >= %s AND created_at < %s",
            window,
        )
        while rows := cursor.fetchmany(FETCH_ROWS):
            for order_id, total, created_at in rows:
                if created_at < due_before and order_id not in credited:
                    missing += 1
                if order_id in wanted:
                    placed[order_id] = (total, created_at)
                dead_letters_open += open_letters.get(order_id, 0)
        outside = sorted(wanted - placed.keys())
        for i in range(0, len(outside), LOOKUP_CHUNK):
            chunk = outside[i : i + LOOKUP_CHUNK]
            placeholders = ", ".join(["%s"] * len(chunk))
            cursor.execute(f"SELECT id, total, created_at FROM orders WHERE id IN ({placeholders})", chunk)  # noqa: S608
            placed.update((order_id, (total, created_at)) for order_id, total, created_at in cursor.fetchall())
    orphan = mismatch = misdated = 0
    for _, order_id, total, ordered_at in awarded:
        order = placed.get(order_id)
        if order is None:
            orphan += 1
            continue
        mismatch += total != 2 * order[0]
        misdated += ordered_at is not None and ordered_at != order[1]
    return {
        "missing_credit": missing,
        "credit_amount_mismatch": mismatch,
        "credit_ordered_at_mismatch": misdated,
        "orphan_credit": orphan,
        "dead_letters_open": dead_letters_open,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--date", type=date.fromisoformat, required=True, help="the last day checked")
    parser.add_argument("--days", type=int, default=1)
    args = parser.parse_args()
    result = sql_baseline(args.date, args.days)
    # VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss across exec, so a child of a big bench process would
    # report its parent's peak.
    result["peak_rss_bytes"] = peak_rss_bytes(os.getpid())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
