"""The analytics benchmark's record and report: each run recorded with the load after it, the runs checked against
the planted violations, and the seed and run tables in Markdown.
"""

import json
import time
from collections.abc import Callable
from pathlib import Path

MIB = 1024 * 1024
# The variant that reads, shuffles and pairs a day once, reporting no violations (bench/analytics_floor.py).
FLOOR = "spark floor, day"
PROGRESS_SECONDS = 15


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def record(runs: list[dict], orders: int, variant: str, attempt: int, run: dict, expected: dict[str, int]) -> None:
    """Keep a run's figures with the variant, the load after it and the violations it should have found."""
    run = {
        "orders": orders,
        "variant": variant,
        "attempt": attempt,
        "load_average_after": load_average(),
        "expected": expected,
        **run,
    }
    runs.append(run)
    print(f"{orders:,} orders, {variant} #{attempt}: {json.dumps(run)}", flush=True)


def mismatches(runs: list[dict]) -> list[str]:
    """Every run that failed or whose violations differ from what was planted in its data (none on a balanced day;
    the floor reports none: it only has to succeed).
    """
    wrong = []
    for run in runs:
        name = f"{run['orders']:,} orders, {run['variant']} #{run['attempt']}"
        if run["variant"] == FLOOR:
            if run["exit_code"] != 0:
                wrong.append(f"{name}: failed (exit {run['exit_code']})")
        elif run["found"] != (want := run["expected"]):
            wrong.append(f"{name}: found {run['found']}, planted {want}")
    return wrong


def received(run: dict) -> str:
    megabytes = f"{run['bytes_received'] / MIB:,.2f}" if run.get("bytes_received") is not None else "-"
    rows = f"{run['rows_received']:,}" if run.get("rows_received") is not None else "-"
    return f"{megabytes} / {rows}"


def markdown(seeds: list[dict], runs: list[dict]) -> str:
    def mib(value: int | None) -> str:
        return f"{value / MIB:,.0f}" if value else "-"

    lines = [
        "| orders | seed: rows | wall s | rows/s | client CPU s | DB threads CPU s | DB server CPU s "
        "| client peak MiB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for seed_ in seeds:
        lines.append(
            f"| {seed_['orders']:,} | {seed_['rows']:,} | {seed_['wall_seconds']} | {seed_['rows_per_second']:,} "
            f"| {seed_['client_cpu_seconds']} | {seed_['database_threads_cpu_seconds']} "
            f"| {seed_['database_whole_server_cpu_seconds']} | {mib(seed_['client_peak_rss_bytes'])} |"
        )
    lines += [
        "",
        "| orders | run | # | wall s | CPU s | JVM / Python / executors CPU s | DB threads / server CPU s "
        "| driver JVM peak RSS MiB | heap peak used / after GC / committed MiB | Python peak RSS MiB "
        "| MiB / rows received | found | load after |",
        "|---:|---|---:|---:|---:|---|---|---:|---|---:|---|---:|---|",
    ]
    for run in runs:
        if run["variant"].startswith("sql"):
            split = "- / {} / -".format(run["cpu_seconds"])
            python_rss, jvm_rss, heap = run["python_peak_rss_bytes"], None, "-"
        else:
            cpu = run["cpu"]
            split = f"{cpu['driver_jvm']} / {cpu['driver_python']} / {cpu['executors']}"
            python_rss, jvm_rss = run["driver_python_peak_rss_bytes"], run["driver_jvm_peak_rss_bytes"]
            heap = " / ".join(
                mib(run.get(f"driver_heap_{name}_peak_bytes")) for name in ("used", "after_gc", "committed")
            )
        if run["found"]:
            found = sum(run["found"].values())
        elif run["variant"] == FLOOR and run["exit_code"] == 0:
            found = "- (no checks)"
        else:
            found = f"failed (exit {run.get('exit_code')})"
        lines.append(
            f"| {run['orders']:,} | {run['variant']} | {run['attempt']} | {run['wall_seconds']} | {run['cpu_seconds']} "
            f"| {split} | {run['database_threads_cpu_seconds']} / {run['database_whole_server_cpu_seconds']} "
            f"| {mib(jvm_rss)} | {heap} | {mib(python_rss)} | {received(run)} | {found} "
            f"| {run['load_average_after']} |"
        )
    return "\n".join(lines) + "\n"


def progress_printer(total_rows: int) -> Callable[[int], None]:
    """Return an on_progress callback printing the rows written and the rate every PROGRESS_SECONDS."""
    started = time.monotonic()
    state = {"rows": 0, "printed": started}

    def on_progress(rows: int) -> None:
        state["rows"] += rows
        now = time.monotonic()
        if now - state["printed"] >= PROGRESS_SECONDS or state["rows"] == total_rows:
            state["printed"] = now
            elapsed = now - started
            print(
                f"   seeding: {state['rows']:,}/{total_rows:,} rows in {elapsed:.0f}s "
                f"({state['rows'] / elapsed:,.0f} rows/s, load average {load_average()})",
                flush=True,
            )

    return on_progress
