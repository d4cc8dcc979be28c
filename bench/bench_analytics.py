"""Benchmark of the nightly analytics: seed, one day's run, the 30-day run, 5x the data, and a plain-SQL baseline.

Usage (destroys the orders, outbox, credits and analytics rows of the database it is pointed at):

    DATABASE_URL=mysql://root:@127.0.0.1:3306/creditshop_analytics \\
        python bench/bench_analytics.py --reset [--orders 1000000] [--days 30] [--scale 5] [--repeat 2]

Every run is `manage.py run_nightly_reports` in a fresh process, timed on the wall clock, so JVM start-up is
included. The baseline runs the same eight checks as SQL on MariaDB over the same days; the bench also checks
that both find the same number of violations (a few are planted on the last day).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Keep outbox rows "forever" for the checks: a 30-day history is older than the default 7-day retention, and the
# bench must run every check on every day, as the SQL baseline does.
os.environ["OUTBOX_RETENTION_DAYS"] = "3650"

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402

from analytics.checks import CHECK_NAMES  # noqa: E402
from analytics.period import Period  # noqa: E402
from analytics.seed import plant_inconsistencies, seed_demo_data  # noqa: E402

TABLES = (
    "analytics_violations",
    "analytics_check_results",
    "analytics_daily_metrics",
    "analytics_user_daily_credits",
    "analytics_nightly_runs",
    "order_credits",
    "transaction_log",
    "idempotency_keys",
    "orders",
)

# The checks as a person would write them in SQL, per day; {start} {end} {cutoff} are UTC DATETIME literals, and
# {collation} is foreign_key's, so comparing it with the order id as text can use the unique index.
SQL_CHECKS = {
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
    "missing_credit": """
        SELECT DATE(o.created_at), COUNT(*) FROM orders o
        WHERE o.created_at >= '{start}' AND o.created_at < '{end}' AND o.created_at < '{cutoff}'
          AND NOT EXISTS (SELECT 1 FROM order_credits c WHERE c.order_id = o.id)
        GROUP BY 1""",
    "credit_amount_mismatch": """
        SELECT DATE(c.created_at), COUNT(*) FROM order_credits c JOIN orders o ON o.id = c.order_id
        WHERE c.created_at >= '{start}' AND c.created_at < '{end}' AND c.total <> 2 * o.total
        GROUP BY 1""",
    "orphan_credit": """
        SELECT DATE(c.created_at), COUNT(*) FROM order_credits c
        WHERE c.created_at >= '{start}' AND c.created_at < '{end}'
          AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.id = c.order_id)
        GROUP BY 1""",
    "duplicate_credit": """
        SELECT DATE(latest), COUNT(*) FROM (
          SELECT c.order_id, MAX(c.created_at) AS latest FROM order_credits c
          WHERE c.order_id IN (SELECT order_id FROM order_credits
                               WHERE created_at >= '{start}' AND created_at < '{end}')
          GROUP BY c.order_id HAVING COUNT(*) > 1) d
        WHERE latest >= '{start}' AND latest < '{end}'
        GROUP BY 1""",
    "stuck_outbox": """
        SELECT DATE(created_at), COUNT(*) FROM transaction_log
        WHERE business = 'order' AND created_at >= '{start}' AND created_at < '{end}'
          AND created_at < '{cutoff}' AND status NOT IN ('published', 'discarded')
        GROUP BY 1""",
}


def reset() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SET FOREIGN_KEY_CHECKS = 0")
        for table in TABLES:
            cursor.execute(f"TRUNCATE TABLE {table}")
        cursor.execute("SET FOREIGN_KEY_CHECKS = 1")


def seed(orders: int, days: int, end: date) -> dict:
    result = seed_demo_data(orders=orders, days=days, users=max(1, orders // 20), end=end, seed=42)
    planted = plant_inconsistencies(day=end, per_kind=3, seed=42)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE TABLE orders, transaction_log, order_credits")
        cursor.fetchall()
    return {
        "orders": orders,
        "rows": result.rows,
        "seconds": round(result.seconds, 1),
        "rows_per_second": round(result.rows_per_second),
        "planted": {k: len(v) for k, v in planted.items()},
    }


def nightly(end: date, days: int, reports: Path) -> tuple[float, dict[str, int]]:
    """Run the command in a new process; return its wall time and the violations it found per check."""
    command = [sys.executable, str(ROOT / "manage.py"), "run_nightly_reports", "--date", str(end), "--days", str(days)]
    env = {**os.environ, "REPORTS_DIR": str(reports)}
    started = time.monotonic()
    completed = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    if completed.returncode != 0:
        raise SystemExit(f"run failed:\n{completed.stdout}\n{completed.stderr[-5000:]}")
    print("   " + "\n   ".join(line for line in completed.stdout.splitlines() if "done in" in line), flush=True)
    found = dict.fromkeys(CHECK_NAMES, 0)
    for day in Period.ending(end, days=days).dates:
        checks = json.loads((reports / str(day) / "consistency.json").read_text())["checks"]
        for name in CHECK_NAMES:
            found[name] += checks[name]["count"]
    return wall, found


def sql_baseline(end: date, days: int) -> tuple[float, dict[str, int]]:
    period = Period.ending(end, days=days)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT collation_name FROM information_schema.columns"
            " WHERE table_schema = DATABASE() AND table_name = 'transaction_log' AND column_name = 'foreign_key'"
        )
        (collation,) = cursor.fetchone()
    now = datetime.now(UTC)
    cutoff = now - timedelta(seconds=settings.CONSISTENCY_GRACE_SECONDS)

    def literal(value: datetime) -> str:
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")

    found = dict.fromkeys(CHECK_NAMES, 0)
    started = time.monotonic()
    with connection.cursor() as cursor:
        for name, sql in SQL_CHECKS.items():
            query = sql.format(
                start=literal(period.start), end=literal(period.end), cutoff=literal(cutoff), collation=collation
            )
            cursor.execute(query)
            found[name] = sum(count for _, count in cursor.fetchall())
    return time.monotonic() - started, found


def measure(label: str, repeat: int, fn) -> dict:
    walls, found = [], None
    for attempt in range(repeat):
        wall, found = fn()
        walls.append(wall)
        print(f"{label} #{attempt + 1}: {wall:.1f}s {found}", flush=True)
    return {"walls": [round(w, 1) for w in walls], "median": round(statistics.median(walls), 1), "found": found}


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reset", action="store_true", help="required: empty the tables before seeding")
    parser.add_argument("--orders", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--scale", type=int, default=5, help="then repeat with this many times the orders (0: skip)")
    parser.add_argument("--repeat", type=int, default=2, help="timed runs per measurement (the median is reported)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--seed-only", action="store_true", help="reset and seed --orders, then stop")
    parser.add_argument(
        "--skip-seed", action="store_true", help="measure the data already there (seeded with --seed-only)"
    )
    args = parser.parse_args()
    if args.skip_seed and args.scale:
        raise SystemExit("--skip-seed measures one size: pass --scale 0 and the --orders that were seeded")
    if not args.reset and not args.skip_seed:
        raise SystemExit("this bench empties the orders, outbox, credits and analytics tables: pass --reset")
    end = date.today() - timedelta(days=1)
    if args.seed_only:
        reset()
        print(f"seeded: {seed(args.orders, args.days, end)}")
        return
    results = {
        "database": connection.settings_dict["NAME"],
        "spark_master": settings.SPARK_MASTER,
        "cpus": os.cpu_count(),
        "end": str(end),
        "sizes": [],
    }
    sizes = [args.orders] + ([args.orders * args.scale] if args.scale else [])
    for orders in sizes:
        print(f"== {orders:,} orders over {args.days} days ending {end} (load average {load_average()})", flush=True)
        if args.skip_seed:
            size = {"seed": {"orders": orders, "skipped": True}}
        else:
            reset()
            size = {"seed": seed(orders, args.days, end)}
        print(f"seeded: {size['seed']}", flush=True)
        with tempfile.TemporaryDirectory(prefix="bench-reports-") as reports:
            size["day_run"] = measure("one day (spark)", args.repeat, lambda: nightly(end, 1, Path(reports)))
            size["full_run"] = measure(
                f"{args.days} days (spark)", args.repeat, lambda: nightly(end, args.days, Path(reports))
            )
        size["day_sql"] = measure("one day (sql)", args.repeat, lambda: sql_baseline(end, 1))
        size["full_sql"] = measure(f"{args.days} days (sql)", args.repeat, lambda: sql_baseline(end, args.days))
        for scope in ("day", "full"):
            spark_found, sql_found = size[f"{scope}_run"]["found"], size[f"{scope}_sql"]["found"]
            assert spark_found == sql_found, f"{scope}: spark found {spark_found}, SQL found {sql_found}"
        size["load_average_after"] = load_average()
        results["sizes"].append(size)
    if len(results["sizes"]) == 2:
        small, big = results["sizes"]
        results["scaling"] = {
            scope: round(big[scope]["median"] / small[scope]["median"], 2) for scope in ("day_run", "full_run")
        }
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
