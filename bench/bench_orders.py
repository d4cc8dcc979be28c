"""Benchmark order creation over HTTP: the whole host's CPU per order, against a plain outbox endpoint in the same run.

Default: ``--rounds`` interleaved rounds of two variants, each `wrk -t2 -c8` keep-alive POSTs to
``/api/orders/`` under `gunicorn config.wsgi` (4 workers x 2 gthreads, DJANGO_DEBUG=false), run as deployed: the
rate limit on (ORDERS_RATE_LIMIT, default 20/second per user; the requests rotate over ``--users`` tokens so it never
refuses), a fresh Idempotency-Key on every POST, and the workers as docs/OPERATIONS.md deploys them, started by the
bench: a relay loop (`manage.py relay_outbox`), an outbox worker (`celery -A config worker -Q outbox`: wake-ups while
no loop listens, the sweeper) and one solo consumer per core (`-Q credits -P solo`, two here); "worker" is the last
three together.

- **ours**: the service as it is;
- **plain**: the same gunicorn, settings and middleware serving bench/plain_urls.py, the endpoint written the plain
  way (DRF's TokenAuthentication and UserRateThrottle, a ModelSerializer, ``Order.objects.create`` and
  ``TransactionLog.objects.create`` in one ``transaction.atomic``; no idempotency record, no wake-up);
- **bare**: the same gunicorn, settings and middleware serving bench/bare_urls.py, ours with every framework layer it
  can skip (one Django function view calling the service's own token look-up, throttle counter, order batch and
  answer; no DRF): the floor of this design on this stack, not an endpoint to serve;
- **before** (``--before-dir``): another checkout's web, with this checkout's relay and worker;
- **before-relay** (``--before-dir``): this checkout's web and worker, the other checkout's relay (started in place
  of this one's for the run), to compare relays in one run.

Each run charges the CPU (from /proc) of every process involved to the orders it placed (counted in the database):
gunicorn (master and workers), the relay, the worker, and the shared mariadbd, RabbitMQ (beam.smp) and redis-server
(found by the port they listen on). Other work on a shared machine lands in the shared servers' figures: the idle
row before each run shows how much. Between runs the bench waits until the relay and the worker have caught up.

    .venv/bin/python bench/bench_orders.py --rounds 3 [--seconds 15] [--users 100]
    .venv/bin/python bench/bench_orders.py --variants ours,before,plain --before-dir ../main   # a before/after too

Also: ``--profile N`` runs N order requests through the Django stack in this process under cProfile and prints
where the web's CPU goes; ``--ceiling-floor`` measures the raw database ceiling (8 threads x two INSERTs and a COMMIT
over mysqlclient) and the framework floor (an empty DRF view, bench/floor.py) beside the service, with the SQL one
request runs.

Tracing overhead: ``--compare-tracing ROUNDS`` runs the HTTP measure ROUNDS times for each of: today's code from
another checkout (``--baseline-dir``, run with this venv; skipped without it), this code with tracing off (the
packages installed, no OTEL_* set), and this code with tracing on (every trace sampled and exported over OTLP/HTTP to
a sink in this process), interleaved; every run is printed, with gunicorn's CPU per order.

    .venv/bin/python bench/bench_orders.py --compare-tracing 3 --baseline-dir /tmp/creditshop-main
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import (  # noqa: E402
    ROOT,
    VENV_BIN,
    HostCpu,
    OtlpSink,
    bench_env,
    outbox_backlog_discard,
    ratio,
    setup_django,
    start_gunicorn,
)
from orders_ceiling import ceiling_floor, profile_requests  # noqa: E402
from wrk import CLIENTS, PORT, measure_http, parse_wrk, run_wrk  # noqa: E402

from core.stats import percentile  # noqa: E402
from testkit.processes import stop_processes  # noqa: E402

USER_PREFIX = "bench-orders-"
# The deployed default: the bench runs with the limit on, over enough users that it never refuses.
RATE_LIMIT = "20/second"
CONSUMERS = 2  # one solo consumer per core of this 2-core machine (docs/OPERATIONS.md)


def compare_tracing(tokens: list[str], args: argparse.Namespace) -> None:
    """Measure HTTP orders/s and gunicorn CPU per order for baseline / tracing off / tracing on, interleaved."""
    sink = OtlpSink()
    variants = {"tracing off": {"extra_env": {}}, "tracing on": {"extra_env": sink.env()}}
    if args.baseline_dir:
        variants = {"baseline (today's code)": {"code_dir": Path(args.baseline_dir)}, **variants}
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    print("| round | variant | orders/s | gunicorn CPU ms/order | p50 ms | p99 ms | non-2xx |")
    print("|---|---|---|---|---|---|---|")
    try:
        for round_number in range(1, args.compare_tracing + 1):
            for name, options in variants.items():
                result = measure_http(tokens, args.seconds, args.workers, args.threads, **options)
                runs[name].append(result)
                print(
                    f"| {round_number} | {name} | {result['orders_per_s']:.0f} | {result['cpu_ms_per_order']:.3f} | "
                    f"{result['p50_ms']:.2f} | {result['p99_ms']:.2f} | {result['non_2xx']} |",
                    flush=True,
                )
    finally:
        sink.close()
        outbox_backlog_discard("bench_orders: no relay runs during the benchmark")
    print()
    print("| variant | median orders/s | median CPU ms/order |")
    print("|---|---|---|")
    for name, results in runs.items():
        rates = sorted(r["orders_per_s"] for r in results)
        cpu = sorted(r["cpu_ms_per_order"] for r in results)
        print(f"| {name} | {percentile(rates, 50):.0f} | {percentile(cpu, 50):.3f} |")
    print(f"spans exported to the sink: {sink.requests} OTLP requests, {sink.bytes:,} bytes")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (2 cores shared with other work)")
    print(json.dumps({name: results for name, results in runs.items()}))


class Pipeline:
    """The relay and the worker the orders flow on to, and the CPU of every process an order costs."""

    def __init__(self, code_dir: Path = ROOT):
        from django.conf import settings

        env = bench_env(ORDERS_RATE_LIMIT=RATE_LIMIT)
        self.relay_dir = code_dir
        self.relay = subprocess.Popen([sys.executable, "manage.py", "relay_outbox"], cwd=code_dir, env=env)
        # The workers as deployed (docs/OPERATIONS.md): an outbox worker (wake-ups while no relay loop listens, the
        # sweeper) and one solo consumer per core.
        celery = [str(VENV_BIN / "celery"), "-A", "config", "worker", "--loglevel=warning"]
        self.workers = [
            subprocess.Popen([*celery, "-Q", "outbox", "-n", "outbox@%h"], cwd=code_dir, env=env),
            *(
                subprocess.Popen(
                    [*celery, "-Q", "credits", "-P", "solo", "-n", f"credits{n}@%h"], cwd=code_dir, env=env
                )
                for n in range(1, CONSUMERS + 1)
            ),
        ]
        self.cpu = HostCpu()
        self.cpu.add("relay", self.relay.pid)
        self.cpu.add("worker", *(worker.pid for worker in self.workers))
        database = settings.DATABASES["default"]
        self.cpu.add_listener("mariadbd", int(database["PORT"] or 3306))
        self.cpu.add_listener("rabbitmq", urlsplit(settings.CELERY_BROKER_URL).port or 5672)
        self.cpu.add_listener("redis", urlsplit(settings.REDIS_URL).port or 6379)
        # Orders an earlier run left uncredited (discarded outbox rows) stay so; only the gap may not grow.
        orders, _, credits = self.counts()
        self.uncredited = orders - credits

    def use_relay(self, code_dir: Path) -> None:
        """Run the relay from `code_dir` (another checkout's, with this venv) from now on; no-op if it already is."""
        if code_dir == self.relay_dir:
            return
        stop_processes(self.relay, grace=15)
        env = bench_env(ORDERS_RATE_LIMIT=RATE_LIMIT)
        self.relay = subprocess.Popen([sys.executable, "manage.py", "relay_outbox"], cwd=code_dir, env=env)
        self.relay_dir = code_dir
        self.cpu.add("relay", self.relay.pid)
        time.sleep(3)  # imported and listening before the warm-up's wake-ups

    def counts(self) -> tuple[int, int, int]:
        """Return (orders, pending outbox rows, credits) in the bench databases."""
        from credits.models import OrderCredit
        from orders.models import Order
        from outbox.models import TransactionLog

        pending = TransactionLog.objects.filter(status=TransactionLog.Status.PENDING).count()
        return Order.objects.count(), pending, OrderCredit.objects.count()

    def settle(self, timeout: float = 120) -> bool:
        """Wait until every order is relayed and credited; return whether that happened within `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            orders, pending, credits = self.counts()
            if pending == 0 and orders - credits <= self.uncredited:
                return True
            time.sleep(0.5)
        return False

    def close(self) -> None:
        stop_processes(self.relay, grace=15)
        for worker in self.workers:
            stop_processes(worker, grace=15)


def measure_variant(pipeline: Pipeline, name: str, tokens: list[str], args: argparse.Namespace) -> dict:
    """Serve one variant from a fresh gunicorn, warm it up, then measure one wrk run against the whole host."""
    from testkit import processes

    name, _, overrides = name.partition(":")
    env = {"ORDERS_RATE_LIMIT": RATE_LIMIT, **dict(pair.split("=", 1) for pair in overrides.split(";") if pair)}
    if name in ("plain", "bare"):
        env.update(DJANGO_SETTINGS_MODULE=name, PYTHONPATH=str(Path(__file__).resolve().parent))
    code_dir = Path(args.before_dir) if name == "before" else ROOT
    pipeline.use_relay(Path(args.before_dir) if name == "before-relay" else ROOT)
    gunicorn = start_gunicorn(PORT, workers=args.workers, threads=args.threads, code_dir=code_dir, **env)
    try:
        run_wrk(tokens, args.warm_up)  # warm-up: connections opened, code paths hot
        settled = pipeline.settle()
        pipeline.cpu.add("gunicorn", gunicorn.pid)
        idle_before = pipeline.cpu.snapshot()
        time.sleep(args.idle)
        before = pipeline.cpu.snapshot()
        idle = HostCpu.per_operation(idle_before, before, 1)  # CPU ms spent over the idle window
        orders_before = pipeline.counts()[0]
        wall = time.monotonic()
        placement: list[list[int]] = []
        count_connections = threading.Timer(
            min(2.0, args.seconds / 2), lambda: placement.append(processes.connections_per_worker(PORT))
        )
        count_connections.start()
        result = parse_wrk(run_wrk(tokens, args.seconds), args.seconds)
        count_connections.join()
        wall = time.monotonic() - wall
        after = pipeline.cpu.snapshot()
        orders = pipeline.counts()[0] - orders_before
        # The relay and the awards of the last orders lag the requests by a few ms; their CPU belongs here too.
        settled = pipeline.settle() and settled
        after = pipeline.cpu.snapshot()
    finally:
        stop_processes(gunicorn, grace=15)
    result.update(
        orders=orders,
        orders_per_s_db=orders / wall,
        settled=settled,
        cpu_ms_per_order=HostCpu.per_operation(before, after, orders),
        idle_cpu_percent={k: v / 10 / args.idle for k, v in idle.items()},
        connections_per_worker=placement[0] if placement else [],
    )
    return result


IDLE_SECONDS = 3.0
WARM_UP_SECONDS = 3
PROCESSES = ("gunicorn", "mariadbd", "rabbitmq", "redis", "relay", "worker", "host")


def compare_plain(tokens: list[str], args: argparse.Namespace) -> None:
    """Run ours and plain in interleaved rounds; print every run, then the medians and the ratios ours/plain."""
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if unknown := [
        v for v in variants if v.partition(":")[0] not in ("ours", "plain", "bare", "before", "before-relay")
    ]:
        sys.exit(f"unknown variants: {unknown}")
    if any(v.partition(":")[0] in ("before", "before-relay") for v in variants) and not args.before_dir:
        sys.exit("the before and before-relay variants need --before-dir")
    outbox_backlog_discard("bench_orders: left pending by an earlier run")
    pipeline = Pipeline()
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    cpu_columns = " | ".join(f"{name} CPU ms/order" for name in PROCESSES)
    print(
        f"gunicorn {args.workers} workers x {args.threads} threads, wrk -t2 -c{CLIENTS} for {args.seconds:.0f}s, "
        f"rate limit {RATE_LIMIT} per user over {len(tokens)} users; relay, outbox worker, {CONSUMERS} solo consumers"
    )
    print(
        f"| round | variant | orders/s (db) | p50 ms | p99 ms | non-2xx | {cpu_columns} | idle host CPU % "
        "| connections per gunicorn worker |"
    )
    print("|---|---|---|---|---|---|" + "---|" * (len(PROCESSES) + 2))
    try:
        for round_number in range(1, args.rounds + 1):
            for name in variants:
                result = measure_variant(pipeline, name, tokens, args)
                runs[name].append(result)
                costs = " | ".join(f"{result['cpu_ms_per_order'][p]:.3f}" for p in PROCESSES)
                print(
                    f"| {round_number} | {name} | {result['orders_per_s_db']:.0f} | {result['p50_ms']:.2f} | "
                    f"{result['p99_ms']:.2f} | {result['non_2xx']} | {costs} | "
                    f"{result['idle_cpu_percent']['host']:.0f} | {result['connections_per_worker']} |"
                    + ("" if result["settled"] else " (did not settle)"),
                    flush=True,
                )
    finally:
        pipeline.close()
    print()
    medians = {}
    print("| variant | median orders/s | median p99 ms | " + " | ".join(f"median {p}" for p in PROCESSES) + " |")
    print("|---|---|---|" + "---|" * len(PROCESSES))
    for name, results in runs.items():
        medians[name] = {
            "orders_per_s": percentile(sorted(r["orders_per_s_db"] for r in results), 50),
            "p99_ms": percentile(sorted(r["p99_ms"] for r in results), 50),
            **{p: percentile(sorted(r["cpu_ms_per_order"][p] for r in results), 50) for p in PROCESSES},
        }
        m = medians[name]
        costs = " | ".join(f"{m[p]:.3f}" for p in PROCESSES)
        print(f"| {name} | {m['orders_per_s']:.0f} | {m['p99_ms']:.2f} | {costs} |")
    if {"ours", "plain"} <= medians.keys():
        ours, plain = medians["ours"], medians["plain"]
        print()
        print(f"host CPU per order ours/plain: {ratio(ours['host'], plain['host'])} (target <= 0.6x)")
        print(f"orders/s ours/plain: {ratio(ours['orders_per_s'], plain['orders_per_s'])} (target >= 1.5x)")
        for p in PROCESSES[:-1]:
            print(f"  {p} CPU per order ours/plain: {ratio(ours[p], plain[p])}")
    if {"bare", "plain"} <= medians.keys():
        bare, plain = medians["bare"], medians["plain"]
        print(
            f"bare/plain (the floor of this design): host CPU {ratio(bare['host'], plain['host'])}, "
            f"orders/s {ratio(bare['orders_per_s'], plain['orders_per_s'])}"
        )
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (2 cores, shared with other work)")
    print(json.dumps(runs))


def bench_users(count: int) -> list:
    """Return `count` bench users (created on first use), each with a new key that every variant accepts.

    The key is a DRF authtoken key, what the plain endpoint and an older checkout (--before-dir) read, and also an
    API token of ours, stored only as its digest, as accounts' data migration stores the keys it finds. The last
    run's keys are revoked: only a digest is stored, so a run cannot read them back.
    """
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from accounts.keys import key_digest, key_prefix
    from accounts.models import ApiToken
    from accounts.services import api_tokens_revoke

    user_model = get_user_model()
    users = [user_model.objects.get_or_create(username=f"{USER_PREFIX}{i}")[0] for i in range(count)]
    keys = []
    for user in users:
        api_tokens_revoke(user=user, name="bench")
        Token.objects.filter(user=user).delete()
        key = Token.objects.create(user=user).key
        ApiToken.objects.create(user=user, name="bench", prefix=key_prefix(key), digest=key_digest(key))
        keys.append((user, key))
    return keys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of ours and plain")
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument(
        "--warm-up", type=int, default=WARM_UP_SECONDS, help="seconds of load before each measured run (wrk: whole)"
    )
    parser.add_argument(
        "--idle", type=float, default=IDLE_SECONDS, help="seconds of the idle window read before each measured run"
    )
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--users", type=int, default=100, help="tokens the requests rotate over")
    parser.add_argument(
        "--variants",
        default="ours,plain",
        help="comma-separated, in this order: ours, plain, bare (ours without DRF: the design's floor), before (the"
        " web from --before-dir) or before-relay (our web, the relay from --before-dir), each optionally with"
        " environment overrides for its gunicorn, e.g. 'ours:API_TOKEN_CACHE_SECONDS=0;ORDERS_RATE_LIMIT=none'",
    )
    parser.add_argument(
        "--before-dir", default=None, help="another checkout: the before variant's web, the before-relay one's relay"
    )
    parser.add_argument("--ceiling-floor", action="store_true", help="raw DB ceiling and framework floor instead")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile N requests in process instead")
    parser.add_argument("--compare-tracing", type=int, default=0, metavar="ROUNDS", help="tracing overhead only")
    parser.add_argument("--baseline-dir", default=None, help="another checkout to measure as the baseline")
    args = parser.parse_args()
    # Stopped with SIGTERM (a timeout), still stop the relay, worker and gunicorn this bench started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    setup_django()
    users = bench_users(args.users)
    tokens = [token for _, token in users]
    if args.profile:
        profile_requests(tokens, args.profile)
    elif args.compare_tracing:
        compare_tracing(tokens, args)
    elif args.ceiling_floor:
        ceiling_floor(users[0][0], tokens, args)
    else:
        compare_plain(tokens, args)


if __name__ == "__main__":
    main()
