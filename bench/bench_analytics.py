"""Benchmark of the nightly analytics at scale: seed N orders in a day, then Spark and the plain-SQL baseline.

Usage (destroys the orders, outbox, credits and analytics rows of the two databases it is pointed at):

    DATABASE_URL=mysql://root:@127.0.0.1:3306/creditshop_analytics \\
    CREDITS_DATABASE_URL=mysql://root:@127.0.0.1:3306/creditshop_analytics_credits \\
        python bench/bench_analytics.py --reset --orders 1000000,10000000 --days 1 [--repeat 1] [--cluster] \\
            [--json results.json] [--markdown results.md]

For each size in --orders: empty the tables, seed that many orders over --days days ending --end (default yesterday;
the seed is timed on its own: wall, this process's CPU, the database threads' CPU, rows/s), then --repeat times,
interleaved, the one-day run of `manage.py run_nightly_reports` (a fresh process: JVM start-up included) and the
baseline (bench/analytics_baseline.py, in a process of its own) on the balanced day (nothing planted); then plant a
few inconsistencies of every kind on the last day and measure both again. With --full, also the --days-day run of
each. With --cluster, the largest size's day also runs on a Spark standalone cluster of two one-core workers started
from the installed pyspark (SPARK_MASTER pointed at it), stopped after.

Every run reports its wall time; the CPU seconds of every process it started (the driver's Python and JVM, on the
cluster the executors and daemons), read from /proc; the database server's CPU on the threads serving the two
databases (and the whole server's, which includes whatever else the machine runs); the driver JVM's peak resident
set (VmHWM) and its heap's peaks, in use before a collection and left after one (from a GC log, -Xlog:gc through
JAVA_TOOL_OPTIONS); the baseline's peak RSS; the bytes each received from the databases (its reads go through
bench/byte_counter.py: the Spark run's read URLs, the baseline's database URLs) and, for Spark, the rows (the run's
`rows_received`). The bench fails unless Spark and the baseline both find exactly the planted violations, every one,
and nothing on the balanced day.

`--seed-only` seeds one size and stops; `--skip-seed` measures what the last seed left (it remembers the day and the
planted violations, once planted, in a file in the temporary directory: a planted seed has no balanced day);
`--cluster-only` runs only the cluster variant, `--floor-only` only the floor; `--kinds balanced` or `--kinds planted`
measures that day only.
`--floor` adds, to each round of the day, bench/analytics_floor.py: the least a Spark run must do (start, read the
day, shuffle it by order id, pair it once) and nothing more, so what the job spends above it is measured in the round;
`--floor planted` adds it on the planted day only. The databases' side (reset, seed, plant): bench/analytics_seed.py.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Outbox rows kept "forever": a 30-day history is older than the 7-day retention, and every day's checks need them.
os.environ["OUTBOX_RETENTION_DAYS"] = "3650"

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.db import connections  # noqa: E402

from analytics import class_archive  # noqa: E402
from analytics.checks import CHECK_NAMES  # noqa: E402
from analytics.period import Period  # noqa: E402
from bench.analytics_report import FLOOR, load_average, markdown, mismatches, record  # noqa: E402
from bench.analytics_seed import (  # noqa: E402
    database_names,
    database_server,
    plant,
    seed,
    seed_record_path,
    server_threads,
)
from bench.byte_counter import Relays  # noqa: E402
from bench.proc_stats import ProcessSeen, TreeSampler, gc_log_peaks  # noqa: E402
from testkit.processes import database_url  # noqa: E402
from testkit.spark_cluster import standalone_cluster  # noqa: E402

CLUSTER_WORKERS, CLUSTER_WORKER_CORES = 2, 1
CLUSTER_WORKER_MEMORY, CLUSTER_EXECUTOR_MEMORY = "3g", "2g"


def spark_run(
    end: date, days: int, reports: Path, *, env: dict[str, str], cluster_pids: list[int], counters: Relays
) -> dict:
    """Run `manage.py run_nightly_reports` in a new process, reading through the byte counters; return its figures
    and the violations found per check.
    """
    command = [sys.executable, str(ROOT / "manage.py"), "run_nightly_reports", "--date", str(end), "--days", str(days)]
    reads = {
        "ANALYTICS_ORDERS_READ_URL": counters.url("default", database_url("default")),
        "ANALYTICS_CREDITS_READ_URL": counters.url("credits", database_url("credits")),
    }
    before = counters.received
    run, stdout = spark_process(
        command, reports, env={"REPORTS_DIR": str(reports), **reads, **env}, cluster_pids=cluster_pids
    )
    run["bytes_received"] = counters.received - before
    rows = [int(part.split("=")[1].replace(",", "")) for part in stdout.split() if part.startswith("rows_received=")]
    run["rows_received"] = rows[0] if rows else None
    found = None
    if run["exit_code"] == 0:
        found = dict.fromkeys(CHECK_NAMES, 0)
        for day in Period.ending(end, days=days).dates:
            checks = json.loads((reports / str(day) / "consistency.json").read_text())["checks"]
            for name in CHECK_NAMES:
                found[name] += checks[name]["count"]
    return {**run, "stages": [line.strip() for line in stdout.splitlines() if "done in" in line], "found": found}


def floor_run(end: date, reports: Path) -> dict:
    """Run bench/analytics_floor.py (a day read, shuffled and paired once, nothing else) in a new process; return its
    figures and its parts. It reports no violations, so it has none found.
    """
    command = [sys.executable, str(ROOT / "bench" / "analytics_floor.py"), "--date", str(end), "--days", "1"]
    run, stdout = spark_process(command, reports, env={}, cluster_pids=[])
    floor = json.loads(stdout.splitlines()[-1]) if run["exit_code"] == 0 else {}
    return {**run, **{key: floor.get(key) for key in ("parts", "rows", "uncredited")}, "found": None}


def spark_process(
    command: list[str], reports: Path, *, env: dict[str, str], cluster_pids: list[int]
) -> tuple[dict, str]:
    """Run a Spark driver command in a new process; return its figures (wall, CPU per role, memory) and its stdout."""
    gc_dir = Path(tempfile.mkdtemp(prefix="bench-gc-", dir=reports))
    env = {**os.environ, "JAVA_TOOL_OPTIONS": f"-Xlog:gc:file={gc_dir}/gc-%p.log", **env}
    with (
        tempfile.TemporaryFile("w+") as out,
        tempfile.TemporaryFile("w+") as err,
        server_threads() as database,
    ):
        started = time.monotonic()
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=err, text=True)
        with TreeSampler(lambda: [process.pid, *cluster_pids]) as processes:
            process.wait()
            wall = time.monotonic() - started
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if process.returncode != 0:
        print(f"run failed (exit {process.returncode}):\n{stdout}\n{stderr[-5000:]}", flush=True)
    drivers = processes.matching("org.apache.spark.deploy.SparkSubmit")
    executors = processes.matching("CoarseGrainedExecutorBackend")
    daemons = [seen for pid in cluster_pids if (seen := processes.seen.get(pid))]
    python = processes.seen.get(process.pid) or ProcessSeen(process.pid, "")
    driver_cpu = sum(seen.cpu_seconds for seen in drivers)
    executor_cpu = sum(seen.cpu_seconds for seen in executors)
    daemon_cpu = sum(seen.cpu_seconds for seen in daemons)
    heap = gc_log_peaks(gc_dir / f"gc-{seen.pid}.log" for seen in drivers if (gc_dir / f"gc-{seen.pid}.log").exists())
    run = {
        "exit_code": process.returncode,
        "wall_seconds": round(wall, 1),
        "cpu_seconds": round(processes.total_cpu_seconds(), 1),
        "cpu": {
            "driver_jvm": round(driver_cpu, 1),
            "driver_python": round(python.cpu_seconds, 1),
            "executors": round(executor_cpu, 1),
            "cluster_daemons": round(daemon_cpu, 1),
            "other": round(
                processes.total_cpu_seconds() - driver_cpu - python.cpu_seconds - executor_cpu - daemon_cpu, 1
            ),
        },
        "database_threads_cpu_seconds": database.cpu_seconds,
        "database_whole_server_cpu_seconds": database.whole_server_cpu_seconds,
        "driver_jvm_peak_rss_bytes": max((seen.peak_rss_bytes for seen in drivers), default=None),
        "driver_heap_used_peak_bytes": heap["heap_used_peak_bytes"] or None,
        "driver_heap_after_gc_peak_bytes": heap["heap_after_gc_peak_bytes"] or None,
        "driver_heap_committed_peak_bytes": heap["heap_committed_peak_bytes"] or None,
        "driver_python_peak_rss_bytes": python.peak_rss_bytes,
        "executor_peak_rss_bytes": max((seen.peak_rss_bytes for seen in executors), default=None),
    }
    return run, stdout


def baseline_run(end: date, days: int, counters: Relays) -> dict:
    """Run bench/analytics_baseline.py in a new process, reading through the byte counters; return its figures and
    the violations found per check.
    """
    command = [sys.executable, str(ROOT / "bench" / "analytics_baseline.py"), "--date", str(end), "--days", str(days)]
    env = {
        **os.environ,
        "DATABASE_URL": counters.url("default", database_url("default")),
        "CREDITS_DATABASE_URL": counters.url("credits", database_url("credits")),
    }
    before = counters.received
    with server_threads() as database:
        started = time.monotonic()
        completed = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
        wall = time.monotonic() - started
    if completed.returncode != 0:
        raise SystemExit(f"baseline failed:\n{completed.stdout}\n{completed.stderr[-5000:]}")
    result = json.loads(completed.stdout.splitlines()[-1])
    return {
        "wall_seconds": result["wall_seconds"],
        "process_wall_seconds": round(wall, 1),
        "cpu_seconds": result["cpu_seconds"],
        "parts": result["parts"],
        "database_threads_cpu_seconds": database.cpu_seconds,
        "database_whole_server_cpu_seconds": database.whole_server_cpu_seconds,
        "python_peak_rss_bytes": result["peak_rss_bytes"],
        "bytes_received": counters.received - before,
        "found": result["found"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reset", action="store_true", help="required: empty the tables before seeding")
    parser.add_argument(
        "--orders",
        type=lambda text: [int(size) for size in text.split(",")],
        default=[1_000_000],
        help="comma-separated sizes, each seeded and measured in turn (default 1000000)",
    )
    parser.add_argument("--days", type=int, default=1, help="days the orders are spread over (default 1)")
    parser.add_argument("--full", action="store_true", help="also measure the --days-day run, not only the last day")
    parser.add_argument("--repeat", type=int, default=1, help="timed runs of each variant, interleaved")
    parser.add_argument("--cluster", action="store_true", help="also run the largest size's day on a 2-worker cluster")
    parser.add_argument(
        "--floor",
        nargs="?",
        const="balanced,planted",
        default="",
        choices=("balanced,planted", "planted"),
        help="also run, each time, the day's read, shuffle and one pairing, nothing else (bench/analytics_floor.py);"
        " planted: on the planted day only",
    )
    parser.add_argument(
        "--cluster-only", action="store_true", help="run only the cluster variant (with --skip-seed: the seed left)"
    )
    parser.add_argument("--floor-only", action="store_true", help="run only the floor, on the --floor days")
    parser.add_argument(
        "--kinds",
        default="balanced,planted",
        choices=("balanced,planted", "balanced", "planted"),
        help="the days measured: the balanced day, then the planted one (default both)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the summary tables here")
    parser.add_argument("--seed-only", action="store_true", help="reset and seed one size, then stop")
    parser.add_argument("--skip-seed", action="store_true", help="measure the data a --seed-only left")
    parser.add_argument("--end", type=date.fromisoformat, default=None, help="last seeded day (default: yesterday)")
    args = parser.parse_args()
    if (args.skip_seed or args.seed_only) and len(args.orders) != 1:
        raise SystemExit("--seed-only and --skip-seed take one size in --orders")
    if args.floor_only and not args.floor:
        raise SystemExit("--floor-only runs the floor on the days --floor names: pass --floor too")
    if not args.reset and not args.skip_seed:
        raise SystemExit("this bench empties the orders, outbox, credits and analytics tables: pass --reset")
    if args.skip_seed and not (seed_file := seed_record_path()).exists():
        raise SystemExit(
            f"--skip-seed: no seed of {' and '.join(database_names().values())} recorded on this machine ({seed_file});"
            " seed them first (--reset --seed-only), or point DATABASE_URL and CREDITS_DATABASE_URL at the seeded ones"
        )
    end = args.end or date.today() - timedelta(days=1)
    results = {
        "databases": database_names(),
        "database_server": database_server(),
        "cpus": os.cpu_count(),
        "driver_memory": settings.SPARK_DRIVER_MEMORY,
        "days": args.days,
        "seeds": [],
        "runs": [],
    }
    # As an install does once (manage.py spark_class_archive); untimed, and only when there is none yet.
    if not args.seed_only and not class_archive.archive_option():
        print(f"class archive written (untimed): {class_archive.archive_write()}", flush=True)
    for orders in args.orders:
        print(f"== {orders:,} orders over {args.days} days ending {end} (load average {load_average()})", flush=True)
        if args.skip_seed:
            seeded = json.loads(seed_record_path().read_text())
            if seeded["orders"] != orders or seeded["days"] != args.days:
                raise SystemExit(f"the databases hold {seeded['orders']:,} orders over {seeded['days']} days")
            end = date.fromisoformat(seeded["end"])
        else:
            seeded = seed(orders, args.days, end)
            seed_record_path().write_text(json.dumps(seeded))
            results["seeds"].append(seeded)
        print(f"seeded: {json.dumps(seeded)}", flush=True)
        if args.seed_only:
            return
        scopes = [("day", 1)] + ([(f"{args.days} days", args.days)] if args.full and args.days > 1 else [])
        with tempfile.TemporaryDirectory(prefix="bench-reports-") as reports, Relays(connections) as counters:
            for kind in args.kinds.split(","):
                if kind == "balanced" and seeded["planted"]:
                    print("the seed was planted by an earlier run: no balanced day to measure", flush=True)
                    continue
                if kind == "planted" and not seeded["planted"]:
                    seeded["planted"] = plant(end)
                    seed_record_path().write_text(json.dumps(seeded))
                expected = seeded["planted"] if kind == "planted" else dict.fromkeys(CHECK_NAMES, 0)
                for attempt in range(1, args.repeat + 1):
                    for scope, days in [] if args.cluster_only else scopes:
                        if not args.floor_only:
                            run = spark_run(end, days, Path(reports), env={}, cluster_pids=[], counters=counters)
                            record(results["runs"], orders, f"spark local, {kind} {scope}", attempt, run, expected)
                        if kind in args.floor.split(",") and days == 1:
                            record(results["runs"], orders, FLOOR, attempt, floor_run(end, Path(reports)), expected)
                        if not args.floor_only:
                            baseline = baseline_run(end, days, counters)
                            record(results["runs"], orders, f"sql, {kind} {scope}", attempt, baseline, expected)
            if (args.cluster or args.cluster_only) and orders == max(args.orders):
                with standalone_cluster(
                    workers=CLUSTER_WORKERS,
                    cores=CLUSTER_WORKER_CORES,
                    memory=CLUSTER_WORKER_MEMORY,
                    work_dir=Path(reports),
                ) as cluster:
                    env = {**cluster.job_env(executor_memory=CLUSTER_EXECUTOR_MEMORY), "PYSPARK_PYTHON": sys.executable}
                    for attempt in range(1, args.repeat + 1):
                        run = spark_run(end, 1, Path(reports), env=env, cluster_pids=cluster.pids, counters=counters)
                        variant = f"spark cluster {CLUSTER_WORKERS}x{CLUSTER_WORKER_CORES}, planted day"
                        record(results["runs"], orders, variant, attempt, run, seeded["planted"])
    summary = markdown(results["seeds"], results["runs"])
    print(summary)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(summary)
    if wrong := mismatches(results["runs"]):
        raise SystemExit("violations found differ from those planted:\n" + "\n".join(wrong))


if __name__ == "__main__":
    main()
