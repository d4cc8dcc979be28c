"""Benchmark the relay loop under the web's wake-ups: its CPU per row and commit-to-relayed latency at a fixed rate.

What bench_orders.py's relay column measures, without the web: this process commits outbox rows at ``--rate`` rows/s
(a multi-row INSERT every ``--tick`` seconds, as orders committing on several web workers would) and after each
commit wakes the relay the way the web does (``outbox.wakeup.waker``: one gate in Redis per
OUTBOX_WAKE_INTERVAL_SECONDS, the loop's bell rung through it). A ``manage.py relay_outbox`` loop started for each run
publishes them to the broker (no consumer: the credits queue is purged after each run). Each run charges the relay
process's CPU (from /proc), and the shared mariadbd's and redis-server's (found by their ports), to the rows it
relayed, and reads every row's commit-to-relayed latency (``published_at - created_at``) from the database.

Variants, interleaved in every round: **ours** (this checkout's relay) and **before** (``--before-dir``: another
checkout's ``relay_outbox``, run with this virtualenv), each optionally with environment overrides for the relay
(``ours:OUTBOX_IDLE_SECONDS=2``).

    BENCH_DATABASE_URL=... BENCH_CREDITS_DATABASE_URL=... CELERY_BROKER_URL=amqp://.../vhost \\
    .venv/bin/python bench/bench_relay_wake.py --rounds 3 --seconds 10 --rate 300 --before-dir /tmp/before

It purges the credits queue of the vhost it is given, so it refuses the default one.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    ROOT,
    HostCpu,
    bench_env,
    outbox_backlog_discard,
    setup_django,
)
from core.stats import percentile  # noqa: E402
from testkit.processes import stop_processes  # noqa: E402

PROCESSES = ("relay", "mariadbd", "redis")
BUSINESS = "bench-wake"


def refuse_shared_vhost() -> None:
    from django.conf import settings

    if settings.CELERY_BROKER_URL.rsplit("/", 1)[-1] in ("", "/", "%2F"):
        sys.exit("refusing to run against the default vhost: this benchmark purges the credits queue")


def purge_credits_queue() -> None:
    from config.celery import app
    from core.contract import CREDITS_QUEUE

    with app.connection_for_write() as conn:
        channel = conn.default_channel
        app.amqp.queues[CREDITS_QUEUE](channel).declare()
        channel.queue_purge(CREDITS_QUEUE)


def wait_listening(timeout: float = 30) -> None:
    """Wait until a relay loop's heartbeat is in Redis, so the first wake-ups ring its bell rather than send tasks."""
    from django.core.cache import caches

    from outbox.bell import HEARTBEAT_KEY

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if caches["default"].has_key(HEARTBEAT_KEY):
            return
        time.sleep(0.05)
    raise RuntimeError("the relay loop did not start listening")


def wait_heartbeat_gone(timeout: float = 10) -> None:
    from django.core.cache import caches

    from outbox.bell import HEARTBEAT_KEY

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and caches["default"].has_key(HEARTBEAT_KEY):
        time.sleep(0.05)


def feed(*, rate: float, seconds: float, tick: float, run_id: str) -> int:
    """Commit `rate` rows a second for `seconds`, a multi-row INSERT every `tick`, each followed by a wake-up."""
    from django.db import connection
    from django.utils import timezone

    from core.contract import SCHEMA_VERSION
    from outbox.ids import new_transaction_id
    from outbox.services import MESSAGE_INSERT, wake_relay

    head, _, row = MESSAGE_INSERT.sql.partition(" VALUES ")
    written, start = 0, time.monotonic()
    with connection.cursor() as cursor:
        while (elapsed := time.monotonic() - start) < seconds:
            due = round((elapsed + tick) * rate) - written
            if due > 0:
                now = connection.ops.adapt_datetimefield_value(timezone.now())
                params = []
                for _ in range(due):
                    tid = new_transaction_id()
                    payload = {"schema_version": SCHEMA_VERSION, "transaction_id": tid, "order_id": 0, "user_id": 0}
                    params += [tid, BUSINESS, f"{run_id}-{tid}", json.dumps(payload), "pending", now, now, "", ""]
                cursor.execute(f"{head} VALUES {', '.join([row] * due)}", params)  # noqa: S608 (the model's own)
                written += due
                wake_relay()
            time.sleep(tick - (time.monotonic() - start) % tick)
    return written


def relayed(run_id: str) -> tuple[int, int]:
    """Return (rows of this run still pending, rows published)."""
    from outbox.models import TransactionLog

    rows = TransactionLog.objects.filter(business=BUSINESS, foreign_key__startswith=f"{run_id}-")
    return rows.filter(status=TransactionLog.Status.PENDING).count(), rows.filter(
        status=TransactionLog.Status.PUBLISHED
    ).count()


def latencies_ms(run_id: str) -> list[float]:
    from outbox.models import TransactionLog

    rows = TransactionLog.objects.filter(
        business=BUSINESS, foreign_key__startswith=f"{run_id}-", status=TransactionLog.Status.PUBLISHED
    ).values_list("created_at", "published_at")
    return sorted((published - created).total_seconds() * 1000 for created, published in rows)


def measure(name: str, args: argparse.Namespace, run_number: int) -> dict:
    """Start the variant's relay loop, feed it for --seconds, wait until everything is relayed; return the figures."""
    from django.conf import settings

    variant, _, overrides = name.partition(":")
    code_dir = Path(args.before_dir) if variant == "before" else ROOT
    env = bench_env(**dict(pair.split("=", 1) for pair in overrides.split(";") if pair))
    relay = subprocess.Popen(
        [sys.executable, "manage.py", "relay_outbox"],
        cwd=code_dir,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    run_id = f"{int(time.time())}-{run_number}"
    try:
        wait_listening()
        time.sleep(1.0)  # imports done, connections open
        cpu = HostCpu()
        cpu.add("relay", relay.pid)
        cpu.add_listener("mariadbd", int(settings.DATABASES["default"]["PORT"] or 3306))
        cpu.add_listener("redis", urlsplit(settings.REDIS_URL).port or 6379)
        before = cpu.snapshot()
        wall = time.monotonic()
        written = feed(rate=args.rate, seconds=args.seconds, tick=args.tick, run_id=run_id)
        deadline = time.monotonic() + 60
        while (pending := relayed(run_id))[0] and time.monotonic() < deadline:
            time.sleep(0.05)
        wall = time.monotonic() - wall
        after = cpu.snapshot()
    finally:
        stop_processes(relay, grace=15)
        wait_heartbeat_gone()
    _, published = relayed(run_id)
    latency = latencies_ms(run_id)
    return {
        "rows": written,
        "published": published,
        "pending": pending[0],
        "rows_per_s": written / wall,
        "cpu_ms_per_row": HostCpu.per_operation(before, after, published),
        "relay_cpu_percent": (after["relay"] - before["relay"]) / wall * 100,
        "p50_ms": percentile(latency, 50),
        "p99_ms": percentile(latency, 99),
        "max_ms": latency[-1] if latency else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=300.0, help="rows committed per second")
    parser.add_argument("--tick", type=float, default=0.01, help="seconds between commits (rows per commit follow)")
    parser.add_argument("--variants", default="ours,before", help="comma-separated: ours or before, with overrides")
    parser.add_argument("--before-dir", default=None, help="another checkout whose relay the before variant runs")
    args = parser.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if unknown := [v for v in variants if v.partition(":")[0] not in ("ours", "before")]:
        sys.exit(f"unknown variants: {unknown}")
    if any(v.partition(":")[0] == "before" for v in variants) and not args.before_dir:
        sys.exit("the before variant needs --before-dir")
    setup_django(LOG_LEVEL="WARNING")
    refuse_shared_vhost()
    outbox_backlog_discard("bench_relay_wake: left pending by an earlier run")
    print(f"{args.rate:.0f} rows/s, a commit every {args.tick * 1000:.0f} ms, for {args.seconds:.0f} s per run")
    columns = " | ".join(f"{p} CPU ms/row" for p in PROCESSES)
    print(f"| round | variant | rows/s | relayed p50 | p99 | max | relay CPU % | {columns} |")
    print("|---|---|---|---|---|---|---|" + "---|" * len(PROCESSES))
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    for round_number in range(1, args.rounds + 1):
        for name in variants:
            purge_credits_queue()
            result = measure(name, args, round_number)
            runs[name].append(result)
            costs = " | ".join(f"{result['cpu_ms_per_row'][p]:.3f}" for p in PROCESSES)
            note = f" ({result['pending']} left pending)" if result["pending"] else ""
            print(
                f"| {round_number} | {name}{note} | {result['rows_per_s']:.0f} | {result['p50_ms']:.1f} ms | "
                f"{result['p99_ms']:.1f} ms | {result['max_ms']:.0f} ms | {result['relay_cpu_percent']:.1f} | "
                f"{costs} |",
                flush=True,
            )
    purge_credits_queue()
    print()
    print("| variant | median relay CPU ms/row | median relayed p99 |")
    print("|---|---|---|")
    for name, results in runs.items():
        relay_cpu = sorted(r["cpu_ms_per_row"]["relay"] for r in results)
        p99 = sorted(r["p99_ms"] for r in results)
        print(f"| {name} | {percentile(relay_cpu, 50):.3f} | {percentile(p99, 50):.1f} ms |")
    if len(variants) > 1:
        first = variants[0]
        for name in variants[1:]:
            ratios = [
                a["cpu_ms_per_row"]["relay"] / b["cpu_ms_per_row"]["relay"]
                for a, b in zip(runs[first], runs[name], strict=True)
            ]
            print(f"relay CPU per row, {first} / {name}, per round: {', '.join(f'{r:.2f}' for r in ratios)}")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (2 cores shared with other work)")


if __name__ == "__main__":
    main()
