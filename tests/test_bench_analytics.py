"""The analytics bench's own parts: the plain-SQL baseline finds exactly what was planted, and the /proc readings."""

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import MySQLdb
import pytest
from django.db import connections
from django.utils import timezone

from analytics.checks import CHECK_NAMES
from analytics.extract import ORDER_BUSINESS
from analytics.jobs import window_bounds
from analytics.period import Period
from bench import proc_stats
from bench.analytics_baseline import sql_baseline
from bench.byte_counter import Relays
from bench.proc_stats import ServerThreads, TreeSampler, gc_log_peaks, server_pid
from credits.models import OrderCredit
from demo.plant import plant_inconsistencies
from demo.seed import seed_demo_data
from orders.models import Order
from outbox.models import TransactionLog
from testkit.mariadb_server import MariaDBServer
from testkit.processes import free_port, service_env
from testkit.workers import SPARK_PROCESSES_GROUP

DAY = timezone.now().date() - timedelta(days=1)
TICKS_OF_ROUNDING = 0.05


@pytest.mark.django_db(transaction=True)
def test_the_baseline_finds_exactly_the_planted_violations():
    seed_demo_data(orders=400, days=2, users=20, end=DAY, seed=7)
    planted = plant_inconsistencies(day=DAY, per_kind=2, seed=7)

    result = sql_baseline(DAY, 1)

    assert result["found"] == {name: len(ids) for name, ids in planted.items()}
    assert sum(result["found"].values()) == 16


def test_gc_log_peaks_reads_g1_and_serial_lines(tmp_path):
    (tmp_path / "gc-1.log").write_text(
        "[0.412s][info][gc] GC(0) Pause Young (Normal) (G1 Evacuation Pause) 24M->4M(256M) 3.101ms\n"
        "[2.101s][info][gc] GC(1) Pause Young (Normal) (G1 Evacuation Pause) 1200M->300M(1536M) 40.2ms\n"
        # A concurrent cycle's pauses collect nothing: their "after" is the heap in use then.
        "[2.5s][info][gc] GC(2) Pause Remark 700M->650M(1536M) 2.0ms\n"
        "[2.6s][info][gc] GC(2) Pause Cleanup 680M->680M(1536M) 0.1ms\n"
        "[3.0s][info][gc] GC(3) Pause Full (G1 Compaction Pause) 900M->200M(1536M) 80.0ms\n"
    )
    (tmp_path / "gc-2.log").write_text("[0.2s][info][gc] GC(0) Pause Young (Allocation Failure) 512K->128K(2G) 1ms\n")

    peaks = gc_log_peaks(sorted(tmp_path.iterdir()))

    assert peaks == {
        "heap_used_peak_bytes": 1200 * 1024**2,
        "heap_after_gc_peak_bytes": 300 * 1024**2,
        "heap_committed_peak_bytes": 2 * 1024**3,
    }


@pytest.mark.slow
def test_the_sampler_counts_a_childs_cpu_and_peak_memory():
    burn = (
        'import time; x = b"x" * (64 * 1024 * 1024); t = time.process_time()\nwhile time.process_time() - t < 0.6: pass'
    )
    process = subprocess.Popen([sys.executable, "-c", burn])
    with TreeSampler(lambda: [process.pid]) as sampler:
        process.wait()

    seen = sampler.seen[process.pid]
    assert seen.cpu_seconds >= 0.3
    assert seen.peak_rss_bytes >= 64 * 1024 * 1024
    assert sampler.total_cpu_seconds() >= seen.cpu_seconds


@pytest.mark.django_db(transaction=True)
def test_server_threads_count_the_cpu_of_queries_on_our_schema(monkeypatch):
    # Polls far apart: the query runs after the first poll and ends before a second, so only the poll taken at the
    # stop sees its CPU.
    monkeypatch.setattr(proc_stats, "SERVER_SAMPLE_SECONDS", 60.0)
    params = connections["default"].get_connection_params()
    connections["default"].ensure_connection()
    with (
        ServerThreads(lambda: MySQLdb.connect(**params), [params["database"]]) as server,
        connections["default"].cursor() as cursor,
    ):
        cursor.execute("SELECT BENCHMARK(3000000, MD5('creditshop'))")

    assert server.cpu_seconds is not None and server.cpu_seconds >= 0.2
    # The kernel keeps a process's CPU time and each thread's apart, each rounded to its clock ticks (10 ms): when
    # the query is nearly all the server did, the two sums may differ by a few ticks either way.
    assert server.whole_server_cpu_seconds >= server.cpu_seconds - TICKS_OF_ROUNDING


@pytest.mark.slow
def test_server_threads_find_the_server_we_talk_to_among_several():
    # Tests start other mariadbd processes; after the pid numbers wrap, one of them can come first in /proc.
    second = MariaDBServer(port=free_port())
    try:
        second.install()
        second.start()
        second.create_database("probe")
        params = {"host": "127.0.0.1", "port": second.port, "user": "root", "password": "", "database": "probe"}
        connection = MySQLdb.connect(**params)
        try:
            assert server_pid(connection) == second.pid
            with ServerThreads(lambda: MySQLdb.connect(**params), ["probe"]) as server:
                connection.cursor().execute("SELECT BENCHMARK(3000000, MD5('creditshop'))")
        finally:
            connection.close()
    finally:
        second.remove()

    assert server.cpu_seconds >= 0.2


def bench_on_unseeded_databases(*args: str) -> subprocess.CompletedProcess:
    """Run the bench pointed at databases never seeded (nor created: a refusal comes before any query)."""
    env = {**os.environ, "DATABASE_URL": "mysql://root:@127.0.0.1:3306/never_seeded_orders"}
    env["CREDITS_DATABASE_URL"] = "mysql://root:@127.0.0.1:3306/never_seeded_credits"
    return subprocess.run(
        [sys.executable, "bench/bench_analytics.py", *args],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_skip_seed_without_a_seed_says_what_to_do():
    result = bench_on_unseeded_databases("--skip-seed", "--orders", "1000")

    assert result.returncode == 1
    assert "--skip-seed: no seed of never_seeded_orders and never_seeded_credits recorded" in result.stderr
    assert "Traceback" not in result.stderr


def test_floor_only_without_floor_days_says_what_to_do():
    result = bench_on_unseeded_databases("--reset", "--orders", "1000", "--floor-only")

    assert result.returncode == 1
    assert "--floor-only runs the floor on the days --floor names: pass --floor too" in result.stderr
    assert "Traceback" not in result.stderr


def run_bench(tmp_path, *args: str) -> dict:
    """Run the bench on this run's test databases, seeding a 3,000-order day; return what it measured."""
    results = tmp_path / "results.json"
    # The day named, not the bench's own "yesterday": a run that crosses midnight would seed another day than DAY.
    command = ["bench/bench_analytics.py", "--reset", "--orders", "3000", "--days", "1", "--end", str(DAY), *args]
    completed = subprocess.run(
        [sys.executable, *command, "--json", str(results)],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        # A few audited users of the day's 150, so what the balanced day fetches stays small next to the day.
        env=service_env(TMPDIR=str(tmp_path), ANALYTICS_AUDIT_USERS="5"),
        timeout=900,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return json.loads(results.read_text())


@pytest.mark.slow
@pytest.mark.xdist_group(SPARK_PROCESSES_GROUP)
def test_the_bench_seeds_a_small_day_and_measures_spark_and_the_baseline_on_the_balanced_day(
    transactional_db, tmp_path
):
    """Seed, then one Spark run and one baseline run of the balanced day (`--kinds balanced`): both find nothing,
    and Spark receives a small part of what the baseline, which reads the day's rows, does."""
    measured = run_bench(tmp_path, "--kinds", "balanced")

    assert [run["variant"] for run in measured["runs"]] == ["spark local, balanced day", "sql, balanced day"]
    assert measured["seeds"][0]["planted"] is None
    for run in measured["runs"]:
        assert run["found"] == dict.fromkeys(CHECK_NAMES, 0)
        assert run["wall_seconds"] > 0 and run["cpu_seconds"] > 0
    # Every byte a run read crossed the counting relay.
    spark_day, baseline_day = measured["runs"]
    assert 0 < spark_day["bytes_received"] < baseline_day["bytes_received"]
    assert spark_day["rows_received"] > 0


@pytest.mark.slow
@pytest.mark.xdist_group(SPARK_PROCESSES_GROUP)
def test_the_bench_plants_faults_and_spark_and_the_baseline_find_exactly_those(transactional_db, tmp_path):
    """Seed and plant (`--kinds planted`), then one Spark run and one baseline run of the planted day: both find
    exactly what was planted."""
    measured = run_bench(tmp_path, "--kinds", "planted")

    planted = measured["seeds"][0]["planted"]
    assert [run["variant"] for run in measured["runs"]] == ["spark local, planted day", "sql, planted day"]
    assert sum(planted.values()) > 0
    for run in measured["runs"]:
        assert run["found"] == planted
        assert run["wall_seconds"] > 0 and run["cpu_seconds"] > 0 and run["bytes_received"] > 0


@pytest.mark.slow
@pytest.mark.xdist_group(SPARK_PROCESSES_GROUP)
def test_the_bench_measures_the_floor_alone_on_the_planted_day(transactional_db, tmp_path):
    """`--floor-only`: one run of the floor (reads, shuffle and one pairing, nothing else) on the planted day, on the
    rows as they are now, its parts timed."""
    measured = run_bench(tmp_path, "--kinds", "planted", "--floor", "planted", "--floor-only")

    planted = measured["seeds"][0]["planted"]
    (floor,) = measured["runs"]
    assert floor["variant"] == "spark floor, day" and floor["found"] is None
    assert floor["rows"] == rows_in_the_read_window(DAY)
    # Its one pairing, the missing-credit check before look-ups: the planted missing credits are among what it names.
    assert floor["uncredited"] >= planted["missing_credit"] > 0
    assert floor["cpu"]["driver_jvm"] > 0 and floor["driver_heap_used_peak_bytes"] > 0
    assert list(floor["parts"]) == [
        "python and django",
        "plan the window",
        "spark session",
        "read, shuffle by order id, cache",
        "pair orders with credits once",
        "stop the session",
    ]


def rows_in_the_read_window(day) -> dict[str, int]:
    """The rows the job reads for a day (its window: the day and the look-back around it), counted in SQL."""
    window = window_bounds(Period.ending(day))
    within = {"created_at__gte": window["start"], "created_at__lt": window["end"]}
    return {
        "orders": Order.objects.filter(**within).count(),
        "logs": TransactionLog.objects.filter(business=ORDER_BUSINESS, **within).count(),
        "credits": OrderCredit.objects.filter(**within).count(),
    }


@pytest.mark.django_db
def test_the_byte_counter_relays_a_connection_and_counts_what_the_client_receives():
    params = connections["default"].get_connection_params()
    with Relays(connections) as relays:
        client = MySQLdb.connect(**{**params, "host": "127.0.0.1", "port": relays.counters["default"].port})
        try:
            before = relays.received
            cursor = client.cursor()
            cursor.execute("SELECT REPEAT('x', 200000)")
            assert cursor.fetchone()[0] == "x" * 200_000
        finally:
            client.close()
        assert 200_000 <= relays.received - before < 201_000
        assert relays.url("default", "mysql://u:p@db.example:3307/shop") == (
            f"mysql://u:p@127.0.0.1:{relays.counters['default'].port}/shop"
        )
