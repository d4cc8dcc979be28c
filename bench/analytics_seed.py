"""The analytics bench's databases: the tables it empties, a day seeded at scale with its figures, faults planted on
it, and the seed remembered for a later `--skip-seed`. Imported by bench/bench_analytics.py once Django is set up.
"""

import os
import tempfile
from datetime import date
from pathlib import Path

import MySQLdb
from django.db import connections

from analytics.checks import CHECK_NAMES
from analytics.models import DailyMetrics
from bench.analytics_report import progress_printer
from bench.proc_stats import ServerThreads, peak_rss_bytes
from demo.plant import plant_inconsistencies
from demo.seed import seed_demo_data

# The tables a run reads or writes, per database alias (the analytics tables are the order service's database's).
TABLES = {
    "default": (
        "analytics_violations",
        "analytics_check_results",
        DailyMetrics._meta.db_table,
        "analytics_user_daily_credits",
        "analytics_nightly_runs",
        "transaction_log",
        "idempotency_keys",
        "orders",
    ),
    "credits": ("order_credits", "credit_balances", "credit_dead_letters"),
}
PLANTED_PER_KIND = 3


def database_names() -> dict[str, str]:
    return {alias: connections[alias].settings_dict["NAME"] for alias in TABLES}


def server_threads() -> ServerThreads:
    """Count the database server's CPU on the connections to the two bench databases (see bench/proc_stats.py)."""
    return ServerThreads(
        lambda: MySQLdb.connect(**connections["default"].get_connection_params()), database_names().values()
    )


def database_server() -> dict:
    """The server's version and buffer pool: a 10M-order seed outgrows a small pool (Debian's default is 128 MiB)."""
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT VERSION(), @@innodb_buffer_pool_size")
        version, pool = cursor.fetchone()
    return {"version": version, "innodb_buffer_pool_bytes": pool}


def reset() -> None:
    for alias, tables in TABLES.items():
        with connections[alias].cursor() as cursor:
            cursor.execute("SET FOREIGN_KEY_CHECKS = 0")
            for table in tables:
                cursor.execute(f"TRUNCATE TABLE {table}")
            cursor.execute("SET FOREIGN_KEY_CHECKS = 1")


def seed(orders: int, days: int, end: date) -> dict:
    """Reset, then seed; return the seed's figures (a balanced history: nothing planted yet)."""
    reset()
    cpu_started = process_cpu()
    with server_threads() as database:
        result = seed_demo_data(
            orders=orders,
            days=days,
            users=max(1, orders // 20),
            end=end,
            seed=42,
            on_progress=progress_printer(orders * 3),
        )
    seed_cpu = process_cpu() - cpu_started
    seed_peak_rss = peak_rss_bytes(os.getpid())
    analyze()
    return {
        "orders": orders,
        "days": days,
        "end": str(end),
        "rows": result.rows,
        "wall_seconds": round(result.seconds, 1),
        "rows_per_second": round(result.rows_per_second),
        "client_cpu_seconds": round(seed_cpu, 1),
        "database_threads_cpu_seconds": database.cpu_seconds,
        "database_whole_server_cpu_seconds": database.whole_server_cpu_seconds,
        "client_peak_rss_bytes": seed_peak_rss,
        "planted": None,
    }


def analyze() -> None:
    for alias, tables in (("default", "orders, transaction_log"), ("credits", "order_credits")):
        with connections[alias].cursor() as cursor:
            cursor.execute(f"ANALYZE TABLE {tables}")
            cursor.fetchall()


def plant(end: date) -> dict[str, int]:
    """Plant PLANTED_PER_KIND inconsistencies of every kind on the last day; return how many of each."""
    planted = plant_inconsistencies(day=end, per_kind=PLANTED_PER_KIND, seed=42)
    analyze()
    return {name: len(planted.get(name, [])) for name in CHECK_NAMES}


def process_cpu() -> float:
    times = os.times()
    return times.user + times.system


def seed_record_path() -> Path:
    names = "-".join(database_names().values())
    return Path(tempfile.gettempdir()) / f"bench-analytics-seed-{names}.json"
