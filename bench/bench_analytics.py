"""Benchmark of the nightly analytics: seed, one day's run, the 30-day run, 5x the data, and a plain-SQL baseline.

Usage (destroys the orders, outbox, credits and analytics rows of the two databases it is pointed at):

    DATABASE_URL=mysql://root:@127.0.0.1:3306/creditshop_analytics \\
    CREDITS_DATABASE_URL=mysql://root:@127.0.0.1:3306/creditshop_analytics_credits \\
        python bench/bench_analytics.py --reset [--orders 1000000] [--days 30] [--scale 5] [--repeat 2] [--skip-full]

Every run is `manage.py run_nightly_reports` in a fresh process, timed on the wall clock, so JVM start-up is
included; the driver's class archive (`manage.py spark_class_archive`) is written first, untimed, if the machine
has none, as an install does once. The baseline runs the same checks in plain SQL over the same days, and the
bench checks that both find the same number of violations (a few are planted on the last day).

Orders and outbox rows are in one database, credits in another (possibly on another server), so the three checks
that pair an order with its credit (missing_credit, credit_amount_mismatch, orphan_credit) can no longer be one SQL
query. The baseline does what a person without Spark would: one query per side (each database reads its own rows
of the window, plus the rows of the other side's ids found outside it), and the pairing in Python. The checks
within one side stay single SQL queries on that side's database. The bench reports both parts of the baseline.
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
from django.db import connections  # noqa: E402

from analytics import class_archive  # noqa: E402
from analytics.checks import CHECK_NAMES  # noqa: E402
from analytics.period import Period  # noqa: E402
from demo.plant import plant_inconsistencies  # noqa: E402
from demo.seed import seed_demo_data  # noqa: E402

# The tables a run reads or writes, per database alias (the analytics tables are the order service's database's).
TABLES = {
    "default": (
        "analytics_violations",
        "analytics_check_results",
        "analytics_daily_metrics",
        "analytics_user_daily_credits",
        "analytics_nightly_runs",
        "transaction_log",
        "idempotency_keys",
        "orders",
    ),
    "credits": ("order_credits", "credit_balances", "credit_dead_letters"),
}
# Ids per IN (...) list when the baseline looks up the other side's rows by id.
LOOKUP_CHUNK = 1_000

# The checks within one database as a person would write them in SQL, per day, keyed by the database alias;
# {start} {end} {cutoff} are UTC DATETIME literals, and {collation} is foreign_key's, so comparing it with the order
# id as text can use the unique index.
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


def reset() -> None:
    for alias, tables in TABLES.items():
        with connections[alias].cursor() as cursor:
            cursor.execute("SET FOREIGN_KEY_CHECKS = 0")
            for table in tables:
                cursor.execute(f"TRUNCATE TABLE {table}")
            cursor.execute("SET FOREIGN_KEY_CHECKS = 1")


def seed(orders: int, days: int, end: date) -> dict:
    result = seed_demo_data(orders=orders, days=days, users=max(1, orders // 20), end=end, seed=42)
    planted = plant_inconsistencies(day=end, per_kind=3, seed=42)
    for alias, tables in (("default", "orders, transaction_log"), ("credits", "order_credits")):
        with connections[alias].cursor() as cursor:
            cursor.execute(f"ANALYZE TABLE {tables}")
            cursor.fetchall()
    return {
        "orders": orders,
        "rows": result.rows,
        "seconds": round(result.seconds, 1),
        "rows_per_second": round(result.rows_per_second),
        "planted": {k: len(v) for k, v in planted.items()},
    }


def nightly(end: date, days: int, reports: Path) -> tuple[float, dict[str, int], dict]:
    """Run the command in a new process; return its wall time, the violations it found per check, and its CPU time.

    The CPU time (the command and its JVM, sampled from /proc twice a second, so the last half second may be missed)
    is what the run itself needed: on a shared machine the wall time mostly measures the other jobs.
    """
    command = [sys.executable, str(ROOT / "manage.py"), "run_nightly_reports", "--date", str(end), "--days", str(days)]
    env = {**os.environ, "REPORTS_DIR": str(reports)}
    started = time.monotonic()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=err, text=True)
        cpu = 0.0
        while process.poll() is None:
            cpu = max(cpu, tree_cpu_seconds(process.pid))
            time.sleep(0.5)
        wall = time.monotonic() - started
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if process.returncode != 0:
        raise SystemExit(f"run failed:\n{stdout}\n{stderr[-5000:]}")
    print("   " + "\n   ".join(line for line in stdout.splitlines() if "done in" in line), flush=True)
    found = dict.fromkeys(CHECK_NAMES, 0)
    for day in Period.ending(end, days=days).dates:
        checks = json.loads((reports / str(day) / "consistency.json").read_text())["checks"]
        for name in CHECK_NAMES:
            found[name] += checks[name]["count"]
    return wall, found, {"cpu_seconds": round(cpu, 1)}


def tree_cpu_seconds(root: int) -> float:
    """Return the CPU time (user + system, with reaped children) used so far by a process and its live descendants."""
    parents, ticks = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # Fields after the command name: state, ppid, ..., utime, stime, cutime, cstime (proc(5) fields 14-17).
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
        ticks[int(entry.name)] = sum(int(value) for value in fields[11:15])

    def in_tree(pid: int) -> bool:
        while pid > 1:
            if pid == root:
                return True
            pid = parents.get(pid, 0)
        return False

    return sum(t for pid, t in ticks.items() if in_tree(pid)) / os.sysconf("SC_CLK_TCK")


def _literal(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def sql_baseline(end: date, days: int) -> tuple[float, dict[str, int], dict]:
    """Run the checks without Spark; return the wall time, the violations per check, and the time of each part."""
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
    started = time.monotonic()
    for alias, checks in SQL_CHECKS.items():
        with connections[alias].cursor() as cursor:
            for name, sql in checks.items():
                cursor.execute(sql.format(**values))
                found[name] = sum(count for _, count in cursor.fetchall())
    one_side = time.monotonic() - started
    found.update(cross_database_checks(period, cutoff=cutoff))
    wall = time.monotonic() - started
    return (
        wall,
        found,
        {"sql_within_one_database": round(one_side, 1), "across_both_in_python": round(wall - one_side, 1)},
    )


def cross_database_checks(period: Period, *, cutoff: datetime) -> dict[str, int]:
    """Count missing_credit, credit_amount_mismatch and orphan_credit with one query per side and the join in Python.

    The credits database gives the period's credits and which of the period's orders have a credit at all (a range
    on order_id, between the period's smallest and largest order id); the orders database gives the period's
    orders, streamed, and then the orders of credits whose order was placed outside the period, by id.
    """
    window = [period.start, period.end]
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT MIN(id), MAX(id) FROM orders WHERE created_at >= %s AND created_at < %s", window)
        lowest, highest = cursor.fetchone()
    with connections["credits"].cursor() as cursor:
        cursor.execute(
            "SELECT id, order_id, total FROM order_credits WHERE created_at >= %s AND created_at < %s", window
        )
        awarded = cursor.fetchall()
        credited: set[int] = set()
        if lowest is not None:
            cursor.execute("SELECT order_id FROM order_credits WHERE order_id BETWEEN %s AND %s", [lowest, highest])
            credited = {order_id for (order_id,) in cursor.fetchall()}
    wanted = {order_id for _, order_id, _ in awarded}
    totals: dict[int, int] = {}
    missing = 0
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT id, total, created_at < %s FROM orders WHERE created_at >= %s AND created_at < %s",
            [cutoff, *window],
        )
        while rows := cursor.fetchmany(10_000):
            for order_id, total, due in rows:
                if due and order_id not in credited:
                    missing += 1
                if order_id in wanted:
                    totals[order_id] = total
        outside = sorted(wanted - totals.keys())
        for i in range(0, len(outside), LOOKUP_CHUNK):
            chunk = outside[i : i + LOOKUP_CHUNK]
            placeholders = ", ".join(["%s"] * len(chunk))
            cursor.execute(f"SELECT id, total FROM orders WHERE id IN ({placeholders})", chunk)  # noqa: S608
            totals.update(cursor.fetchall())
    orphan = sum(1 for _, order_id, _ in awarded if order_id not in totals)
    mismatch = sum(1 for _, order_id, total in awarded if order_id in totals and total != 2 * totals[order_id])
    return {"missing_credit": missing, "credit_amount_mismatch": mismatch, "orphan_credit": orphan}


def measure(label: str, repeat: int, fn) -> dict:
    walls, parts, found = [], [], None
    for attempt in range(repeat):
        wall, found, part = fn()
        walls.append(wall)
        parts.append(part)
        detail = f" {part}" if part else ""
        print(f"{label} #{attempt + 1}: {wall:.1f}s (load average {load_average()}){detail} {found}", flush=True)
    result = {"walls": [round(w, 1) for w in walls], "median": round(statistics.median(walls), 1), "found": found}
    if any(parts):
        result["parts"] = parts
    return result


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
    parser.add_argument("--skip-full", action="store_true", help="measure the one-day run only, not --days days")
    parser.add_argument(
        "--end",
        type=date.fromisoformat,
        default=None,
        help="last seeded day (default: yesterday; pass the seed's with --skip-seed after midnight)",
    )
    args = parser.parse_args()
    if args.skip_seed and args.scale:
        raise SystemExit("--skip-seed measures one size: pass --scale 0 and the --orders that were seeded")
    if not args.reset and not args.skip_seed:
        raise SystemExit("this bench empties the orders, outbox, credits and analytics tables: pass --reset")
    end = args.end or date.today() - timedelta(days=1)
    if args.seed_only:
        reset()
        print(f"seeded: {seed(args.orders, args.days, end)}")
        return
    results = {
        "databases": {alias: connections[alias].settings_dict["NAME"] for alias in TABLES},
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
        scopes = ("day",) if args.skip_full else ("day", "full")
        # As an install does once (manage.py spark_class_archive); untimed, and only when there is none yet.
        if not class_archive.archive_option():
            print(f"class archive written (untimed): {class_archive.archive_write()}", flush=True)
        with tempfile.TemporaryDirectory(prefix="bench-reports-") as reports:
            size["day_run"] = measure("one day (spark)", args.repeat, lambda: nightly(end, 1, Path(reports)))
            if "full" in scopes:
                size["full_run"] = measure(
                    f"{args.days} days (spark)", args.repeat, lambda: nightly(end, args.days, Path(reports))
                )
        size["day_sql"] = measure("one day (sql)", args.repeat, lambda: sql_baseline(end, 1))
        if "full" in scopes:
            size["full_sql"] = measure(f"{args.days} days (sql)", args.repeat, lambda: sql_baseline(end, args.days))
        for scope in scopes:
            spark_found, sql_found = size[f"{scope}_run"]["found"], size[f"{scope}_sql"]["found"]
            assert spark_found == sql_found, f"{scope}: spark found {spark_found}, SQL found {sql_found}"
        size["load_average_after"] = load_average()
        results["sizes"].append(size)
    if len(results["sizes"]) == 2:
        small, big = results["sizes"]
        results["scaling"] = {
            scope: round(big[scope]["median"] / small[scope]["median"], 2)
            for scope in ("day_run", "full_run")
            if scope in small
        }
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
