"""Benchmark: how fast the credits consumer drains a backlog of queued messages, and that it awards each order once.

It writes N orders with their transaction_log rows (bulk, as seed data), publishes each row's payload to the
`credits` queue with the relay's own Publisher (plus optional re-deliveries; bench/relay_publish.py), then starts real
`celery -A config worker -Q credits` processes and times the drain from the database's own timestamps.

    export DATABASE_URL=mysql://root:@127.0.0.1:3306/creditshop_bench_orders
    export CREDITS_DATABASE_URL=mysql://root:@127.0.0.1:3306/creditshop_bench_credits
    export CELERY_BROKER_URL=amqp://guest:guest@127.0.0.1:5672/credits
    python manage.py migrate && python manage.py migrate --database credits
    DJANGO_DEBUG=false python bench/bench_credits.py --messages 20000 --processes 2 --pool solo

Per award, from /proc, from the first award to the empty queue (start-up excluded): the CPU of the worker processes,
of the MariaDB, RabbitMQ and Redis servers they talk to (found by their listening ports, so a test's own servers are
not charged), their sum ("involved"), and the whole host's busy CPU (/proc/stat: every process, other work included).

Before/after: ``--baseline-dir DIR --rounds N`` drains the same backlog with DIR's workers (another checkout, same
venv) and this checkout's, tracing off, alternating which goes first in each round, and prints every run and the
after/before ratios:

    git worktree add /tmp/main main --detach
    DJANGO_DEBUG=false python bench/bench_credits.py --messages 6000 --baseline-dir /tmp/main --rounds 4

With --cluster-broker-url URL it compares that quorum-queue cluster with the configured broker (bench/brokers.py).

Exit status 1 when an order is credited twice or not at all, or a balance disagrees with its entries.

Tracing overhead: ``--compare-tracing ROUNDS`` drains the backlog ROUNDS times for each of: another checkout
(``--baseline-dir``, same venv; skipped without it) with tracing off, this code with tracing off (packages
installed, no OTEL_* set), this code with tracing on (every trace sampled, exported over OTLP/HTTP to a sink in this
process), tracing on without the per-statement SQL spans, and the other checkout with tracing on, interleaved within
each round. Every message carries a
traceparent and the relay's creation-time header in all variants, as the relay sends them, so the worker's spans are
children of a (synthetic) order request.

    DJANGO_DEBUG=false python bench/bench_credits.py --messages 5000 --compare-tracing 3 --baseline-dir /tmp/main
"""

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.db import connections  # noqa: E402
from django.db.models import Sum  # noqa: E402
from kombu import Connection  # noqa: E402

from bench import brokers  # noqa: E402
from bench.common import OtlpSink, host_busy_seconds, listener_pid, process_tree_cpu_seconds  # noqa: E402
from bench.credits_backlog import (  # noqa: E402
    TRACING_OFF,
    USER_PREFIX,
    bench_cleanup,
    broker_prepare,
    orders_seed,
    publish_all,
)
from config.celery import app  # noqa: E402
from core.contract import CREDITS_QUEUE  # noqa: E402
from credits.models import CreditBalance, DeadLetter, OrderCredit  # noqa: E402
from testkit.processes import stop_processes  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000, help="orders, hence distinct messages")
    parser.add_argument("--users", type=int, default=1_000, help="users the orders are spread over")
    parser.add_argument("--duplicates", type=float, default=0.0, help="extra re-deliveries, as a share of messages")
    parser.add_argument("--processes", type=int, default=2, help="worker processes executing awards")
    parser.add_argument(
        "--pool",
        choices=["prefork", "solo", "threads"],
        default="solo",
        help="solo: N workers, each executing in its own process (less CPU per award); prefork: one worker, N pool;"
        " threads: N workers, each running --threads tasks at once in one process",
    )
    parser.add_argument("--threads", type=int, default=4, help="tasks in flight per worker process with --pool threads")
    parser.add_argument("--prefetch", type=int, default=None, help="worker --prefetch-multiplier (default: config)")
    parser.add_argument("--keep", action="store_true", help="keep the bench rows afterwards")
    parser.add_argument("--compare-tracing", type=int, default=0, metavar="ROUNDS", help="tracing overhead only")
    parser.add_argument(
        "--baseline-dir",
        default=None,
        help="another checkout (same venv) to measure as the baseline: alone, a before/after comparison of whole-host"
        " CPU per award; with --compare-tracing, the tracing comparison's baseline",
    )
    parser.add_argument("--rounds", type=int, default=3, help="before/after rounds with --baseline-dir")
    brokers.add_arguments(parser)
    return parser.parse_args()


def workers_start(
    args: argparse.Namespace, log_dir: Path, *, code_dir: Path | None = None, env: dict | None = None
) -> list[subprocess.Popen]:
    """Start the workers: one prefork worker with N processes, or N solo workers (from `code_dir`, with `env`)."""
    base = [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", CREDITS_QUEUE, "--loglevel", "WARNING"]
    base += ["--without-mingle", "--without-gossip", "--without-heartbeat"]
    if args.prefetch:
        base += ["--prefetch-multiplier", str(args.prefetch)]
    if args.pool == "prefork":
        commands = [base + ["-P", "prefork", "-c", str(args.processes), "-n", "bench-credits@%h"]]
    elif args.pool == "threads":
        pool = ["-P", "threads", "-c", str(args.threads)]
        commands = [base + pool + ["-n", f"bench-credits-{i}@%h"] for i in range(args.processes)]
    else:
        commands = [base + ["-P", "solo", "-n", f"bench-credits-{i}@%h"] for i in range(args.processes)]
    processes = []
    for i, command in enumerate(commands):
        with open(log_dir / f"bench-credits-worker-{i}.log", "wb") as log:
            processes.append(
                subprocess.Popen(
                    command,
                    cwd=code_dir or settings.BASE_DIR,
                    env={**os.environ, **(env or {})},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    return processes


def workers_stop(processes: list[subprocess.Popen]) -> None:
    stop_processes(*processes, grace=30, group=True)


def server_pids() -> dict[str, int]:
    """Return the pids of the MariaDB, RabbitMQ and Redis servers this benchmark's workers talk to, by name."""
    ports = {
        "MariaDB": settings.DATABASES["credits"].get("PORT") or 3306,
        "RabbitMQ": urlsplit(settings.CELERY_BROKER_URL).port or 5672,
        "Redis": urlsplit(settings.REDIS_URL).port or 6379,
    }
    found = {name: listener_pid(int(port)) for name, port in ports.items()}
    return {name: pid for name, pid in found.items() if pid is not None}


def cpu_snapshot(processes: list[subprocess.Popen], servers: dict[str, int]) -> dict[str, float]:
    """Return the CPU seconds used so far by the workers (with their children), each server, and the whole host."""
    snapshot = {"workers": sum(process_tree_cpu_seconds(p.pid) for p in processes)}
    snapshot |= {name: process_tree_cpu_seconds(pid) for name, pid in servers.items()}
    snapshot["host"] = host_busy_seconds()
    return snapshot


def bench_credits(order_range: tuple[int, int]):
    return OrderCredit.objects.filter(order_id__gte=order_range[0], order_id__lte=order_range[1])


def main() -> int:
    args = parse_args()
    if args.cluster_broker_url:
        figure = r"drain rate:\s+([\d,]+) awards/s"
        return brokers.compare(
            cluster_url=args.cluster_broker_url, repeat=args.compare_repeat, figure=figure, unit="awards/s"
        )
    if args.compare_tracing:
        return compare_tracing(args)
    if args.baseline_dir:
        return compare_checkouts(args)
    return drain_once(args)["ok"]


def compare_checkouts(args: argparse.Namespace) -> int:
    """Drain the same backlog with the other checkout's workers and this one's, tracing off, interleaved; print all.

    The order within a round alternates (before/after, then after/before), so a drift in the machine's load over
    the run weighs on both sides alike.
    """
    variants = {"before": Path(args.baseline_dir), "after": None}
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    failed = 0
    for round_number in range(1, args.rounds + 1):
        order = list(variants) if round_number % 2 else list(reversed(variants))
        for name in order:
            print(f"--- round {round_number}: {name} ({variants[name] or 'this checkout'})", flush=True)
            result = drain_once(args, code_dir=variants[name], env=TRACING_OFF)
            runs[name].append(result)
            failed |= result["ok"]
    columns = [
        "workers",
        *[name for name in runs["before"][0]["per_award"] if name not in ("workers", "involved", "host")],
    ]
    columns += ["involved", "host"]
    print()
    print(f"before = {args.baseline_dir}, after = this checkout; CPU in ms per award, from /proc; tracing off")
    print("| round | variant | awards/s | " + " | ".join(columns) + " | load (1 min) |")
    print("|---|---|---|" + "---|" * len(columns) + "---|")
    for round_number in range(args.rounds):
        for name in variants:
            result = runs[name][round_number]
            cells = " | ".join(f"{result['per_award'][column]:.3f}" for column in columns)
            print(f"| {round_number + 1} | {name} | {result['rate']:,.0f} | {cells} | {result['load']:.2f} |")
    print()
    print(
        "after / before, per round: "
        + ", ".join(
            f"round {i + 1}: workers {after['per_award']['workers'] / before['per_award']['workers']:.3f},"
            f" involved {after['per_award']['involved'] / before['per_award']['involved']:.3f},"
            f" awards/s {after['rate'] / before['rate']:.3f}"
            for i, (before, after) in enumerate(zip(runs["before"], runs["after"], strict=True))
        )
    )
    medians = {
        name: {column: statistics.median([r["per_award"][column] for r in results]) for column in columns}
        | {"rate": statistics.median([r["rate"] for r in results])}
        for name, results in runs.items()
    }
    for name, figures in medians.items():
        print(
            f"{name}: median {figures['rate']:,.0f} awards/s; CPU ms/award: workers {figures['workers']:.3f},"
            f" involved processes {figures['involved']:.3f}, whole host {figures['host']:.3f}"
        )
    for column in ("workers", "involved", "host"):
        print(
            f"median {column} CPU per award, after / before: {medians['after'][column] / medians['before'][column]:.3f}"
        )
    return failed


def compare_tracing(args: argparse.Namespace) -> int:
    """Drain the same backlog with baseline / tracing off / tracing on workers, interleaved; print every run."""
    sink = OtlpSink()
    variants = {
        "tracing off": {"env": {}},
        "tracing on": {"env": sink.env()},
        "tracing on, TRACING_SQL_SPANS=false": {"env": {**sink.env(), "TRACING_SQL_SPANS": "false"}},
    }
    if args.baseline_dir:
        baseline = {"code_dir": Path(args.baseline_dir)}
        variants = {
            "baseline (other checkout)": baseline,
            **variants,
            "baseline, tracing on": {**baseline, "env": sink.env()},
        }
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    failed = 0
    try:
        for round_number in range(1, args.compare_tracing + 1):
            for name, options in variants.items():
                print(f"--- round {round_number}: {name}", flush=True)
                result = drain_once(args, **options)
                runs[name].append(result)
                failed |= result["ok"]
    finally:
        sink.close()
    print()
    print("| round | variant | awards/s | worker CPU ms/award (steady) |")
    print("|---|---|---|---|")
    for round_number in range(args.compare_tracing):
        for name in variants:
            result = runs[name][round_number]
            print(f"| {round_number + 1} | {name} | {result['rate']:,.0f} | {result['cpu_ms']:.3f} |")
    print()
    for name, results in runs.items():
        rates = sorted(r["rate"] for r in results)
        cpu = sorted(r["cpu_ms"] for r in results)
        print(f"{name}: median {rates[len(rates) // 2]:,.0f} awards/s, {cpu[len(cpu) // 2]:.3f} ms CPU/award")
    print(f"spans exported to the sink: {sink.requests} OTLP requests, {sink.bytes:,} bytes")
    return failed


def drain_once(args: argparse.Namespace, *, code_dir: Path | None = None, env: dict | None = None) -> dict:
    """Seed, publish and drain one backlog; print the report and return rate, CPU per award and ok (0 or 1)."""
    random.seed(20_000)
    bench_cleanup()
    print(f"seeding {args.messages} orders for {args.users} users ...", flush=True)
    payloads = orders_seed(messages=args.messages, users=args.users)
    order_range = (payloads[0]["order_id"], payloads[-1]["order_id"])
    broker_prepare()
    started = time.monotonic()
    sent = publish_all(payloads, duplicates=args.duplicates, code_dir=code_dir)
    print(f"published {sent} messages in {time.monotonic() - started:.1f}s", flush=True)

    log_dir = Path(tempfile.gettempdir())
    servers = server_pids()
    processes = workers_start(args, log_dir, code_dir=code_dir, env=env)
    started = time.monotonic()
    warm = None
    try:
        while (done := bench_credits(order_range).count()) < args.messages:
            if warm is None and done:
                # Every process's CPU once the first award landed: start-up excluded from the per-award figures.
                warm, warm_done = cpu_snapshot(processes, servers), done
            if any(p.poll() is not None for p in processes):
                raise SystemExit(f"a worker exited; see {log_dir}/bench-credits-worker-*.log")
            if time.monotonic() - started > 600:
                raise SystemExit("not drained after 600 s")
            time.sleep(0.2)
        # Re-deliveries of already credited orders may still be in flight; let the queue empty.
        with Connection(settings.CELERY_BROKER_URL) as conn:
            queue = app.amqp.queues[CREDITS_QUEUE].bind(conn.default_channel)
            while queue.queue_declare(passive=True).message_count:
                time.sleep(0.2)
        wall = time.monotonic() - started
        end = cpu_snapshot(processes, servers)
        load = os.getloadavg()[0]
    finally:
        workers_stop(processes)
    if warm is None:  # everything landed before the first look: no steady window to measure
        warm, warm_done = {name: float("nan") for name in end}, 0
    # Milliseconds of CPU per message handled from the first award to the empty queue, for each process.
    per_award = {name: (end[name] - warm[name]) / (sent - warm_done) * 1e3 for name in end}
    per_award["involved"] = sum(per_award[name] for name in ("workers", *servers))

    credits = bench_credits(order_range)
    user_ids = list(get_user_model().objects.filter(username__startswith=USER_PREFIX).values_list("pk", flat=True))
    with connections["credits"].cursor() as cursor:
        cursor.execute(
            "SELECT COUNT(*), COUNT(DISTINCT order_id), TIMESTAMPDIFF(MICROSECOND, MIN(created_at), MAX(created_at))"
            " FROM order_credits WHERE order_id BETWEEN %s AND %s",
            order_range,
        )
        rows, distinct_orders, span_us = cursor.fetchone()
    sums = dict(
        OrderCredit.objects.filter(user_id__in=user_ids)
        .values("user_id")
        .annotate(s=Sum("amount"))
        .values_list("user_id", "s")
    )
    balances = CreditBalance.objects.filter(user_id__in=user_ids).values_list("user_id", "balance")
    wrong_balances = sum(1 for user_id, balance in balances if balance != sums.get(user_id, 0))
    expected_total = 2 * sum(p["total"] for p in payloads)
    awarded_total = sum(credits.values_list("amount", flat=True))
    dead_letters = DeadLetter.objects.filter(order_id__gte=order_range[0], order_id__lte=order_range[1]).count()
    rate = rows / (span_us / 1e6) if span_us else float("inf")

    workers = f"1 worker x {args.processes} prefork processes" if args.pool == "prefork" else None
    if args.pool == "threads":
        workers = f"{args.processes} worker processes x {args.threads} threads"
    workers = workers or f"{args.processes} solo workers"
    print(f"workers:            {workers}, prefetch multiplier {args.prefetch or app.conf.worker_prefetch_multiplier}")
    print(f"messages:           {args.messages} distinct + {sent - args.messages} re-deliveries")
    print(f"drain rate:         {rate:,.0f} awards/s (first to last credit row, by created_at)")
    print(f"wall time:          {wall:.2f} s from worker start to empty queue (includes worker start-up)")
    print(
        f"worker cpu/award:   {per_award['workers']:.3f} ms steady state (from the first award to the empty queue),"
        f" {end['workers'] / sent * 1e3:.3f} ms with start-up"
    )
    print(
        "server cpu/award:   "
        + ", ".join(f"{name} {per_award[name]:.3f} ms" for name in servers)
        + " (whole servers: includes anything else they served meanwhile)"
    )
    print(f"involved cpu/award: {per_award['involved']:.3f} ms (workers + those servers)")
    print(f"host cpu/award:     {per_award['host']:.3f} ms (every process on the host, other work included)")
    print(f"load average:       {load:.2f} (1 min, at the end; 2 cores shared with other work)")
    print(f"credit rows:        {rows} for {distinct_orders} orders (expected {args.messages} for {args.messages})")
    print(f"credits awarded:    {awarded_total} (expected {expected_total})")
    print(f"wrong balances:     {wrong_balances}")
    print(f"dead letters:       {dead_letters}")
    ok = rows == distinct_orders == args.messages and awarded_total == expected_total
    ok = ok and not wrong_balances and not dead_letters
    print("correctness:        " + ("OK (each order credited exactly once)" if ok else "FAILED"))
    print("target >= 1000/s:   " + ("met" if rate >= 1000 else "NOT met"))
    if not args.keep:
        bench_cleanup()
    return {"rate": rate, "cpu_ms": per_award["workers"], "per_award": per_award, "load": load, "ok": 0 if ok else 1}


if __name__ == "__main__":
    sys.exit(main())
