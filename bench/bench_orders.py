"""Benchmark order creation over HTTP against the raw database ceiling measured in the same run.

HTTP: `gunicorn config.wsgi` (gthread workers, keep-alive) driven by wrk with 8 concurrent keep-alive connections,
each POST carrying a fresh Idempotency-Key. Ceiling: 8 threads, each with its own mysqlclient connection, doing
two INSERTs and a COMMIT per transaction with no Django at all. Floor: the same gunicorn and wrk against an empty
DRF view (bench/floor.py), which bounds what any Django/DRF endpoint can reach on the machine. Also counts the
queries one request makes.

    .venv/bin/python bench/bench_orders.py [--seconds 15] [--workers 4] [--threads 2]

Tracing overhead: ``--compare-tracing ROUNDS`` skips the ceiling and floor and runs the HTTP measure ROUNDS times for
each of: today's code from another checkout (``--baseline-dir``, run with this venv; skipped without it), this code
with tracing off (the packages installed, no OTEL_* set), and this code with tracing on (every trace sampled and
exported over OTLP/HTTP to a sink in this process). The variants are interleaved within each round, so machine noise
hits them alike; every run is printed, with gunicorn's CPU per order (master and workers, from /proc).

    .venv/bin/python bench/bench_orders.py --compare-tracing 3 --baseline-dir /tmp/creditshop-main
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    ROOT,
    OtlpSink,
    outbox_backlog_discard,
    percentile,
    process_tree_cpu_seconds,
    setup_django,
    start_gunicorn,
    stop,
)

CLIENTS = 8
PORT = 18080

WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Token %(token)s"
wrk.body = '{"goods_name": "bench item", "total": 3}'
local counter = 0
local thread_id = 0
function setup(thread)
  thread_id = thread_id + 1
  thread:set("tid", thread_id)
end
request = function()
  counter = counter + 1
  wrk.headers["Idempotency-Key"] = "%(run)s-" .. tid .. "-" .. counter
  return wrk.format()
end
"""


def measure_ceiling(seconds: float) -> dict:
    """Run two INSERTs and a COMMIT per transaction from 8 threads over mysqlclient; return tx/s and latencies."""
    import MySQLdb
    from django.conf import settings
    from django.contrib.auth import get_user_model

    from outbox.ids import new_transaction_id

    db = settings.DATABASES["default"]
    user_id = get_user_model().objects.get(username="bench").pk
    latencies: list[float] = []
    counts = [0] * CLIENTS
    stop_at = time.monotonic() + seconds

    def worker(slot: int) -> None:
        conn = MySQLdb.connect(
            host=db["HOST"],
            port=int(db["PORT"] or 3306),
            user=db["USER"],
            password=db["PASSWORD"],
            database=db["NAME"],
            charset="utf8mb4",
            autocommit=False,
        )
        cur = conn.cursor()
        local = []
        while time.monotonic() < stop_at:
            tx = new_transaction_id()
            t0 = time.perf_counter()
            cur.execute(
                "INSERT INTO orders (user_id, goods_name, total, transaction_id, created_at)"
                " VALUES (%s, 'ceiling', 3, %s, UTC_TIMESTAMP(6))",
                (user_id, tx),
            )
            order_id = cur.lastrowid
            cur.execute(
                "INSERT INTO transaction_log (id, business, foreign_key, payload, status, attempts, next_attempt_at,"
                " last_error, created_at, discarded_reason, discarded_by)"
                " VALUES (%s, 'order', %s, %s, 'published', 0, UTC_TIMESTAMP(6), '', UTC_TIMESTAMP(6), '', '')",
                (tx, str(order_id), json.dumps({"order_id": order_id})),
            )
            conn.commit()
            local.append(time.perf_counter() - t0)
            counts[slot] += 1
        latencies.extend(local)
        conn.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    latencies.sort()
    return {
        "tx_per_s": sum(counts) / seconds,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
    }


def parse_wrk(output: str, seconds: float) -> dict:
    def latency_ms(label: str) -> float:
        match = re.search(rf"^\s*{label}%\s+([\d.]+)(us|ms|s)\s*$", output, re.M)
        value, unit = float(match.group(1)), match.group(2)
        return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value

    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    errors = re.search(r"Socket errors: (.*)", output)
    return {
        "requests": int(re.search(r"(\d+) requests in", output).group(1)),
        "orders_per_s": float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1)),
        "p50_ms": latency_ms("50"),
        "p99_ms": latency_ms("99"),
        "non_2xx": int(non_2xx.group(1)) if non_2xx else 0,
        "socket_errors": errors.group(1) if errors else "none",
    }


def measure_http(
    token: str,
    seconds: float,
    workers: int,
    threads: int,
    *,
    floor: bool = False,
    code_dir: Path = ROOT,
    extra_env: dict | None = None,
) -> dict:
    """Drive POST /api/orders/ with wrk; with `floor`, bench/floor.py (an empty view) serves it, not the service.

    Also returns gunicorn's CPU milliseconds per request over the measured run (`cpu_ms_per_order`).
    """
    if not shutil.which("wrk"):
        sys.exit("wrk is needed for the HTTP half: apt-get install wrk")
    env = {"DJANGO_SETTINGS_MODULE": "floor", "PYTHONPATH": str(Path(__file__).resolve().parent)} if floor else {}
    env.update(extra_env or {})
    proc = start_gunicorn(PORT, workers=workers, threads=threads, code_dir=code_dir, **env)
    try:

        def run_wrk(duration: float) -> str:
            # A fresh key prefix per run: a warm-up's keys reused by the measured run would make replays, not orders.
            with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
                script.write(WRK_SCRIPT % {"token": token, "run": f"r{time.time_ns()}"})
            command = ["wrk", "-t2", f"-c{CLIENTS}", f"-d{duration:.0f}s", "--latency", "-s", script.name]
            command.append(f"http://127.0.0.1:{PORT}/api/orders/")
            return subprocess.run(command, check=True, capture_output=True, text=True).stdout

        run_wrk(3)  # warm-up
        cpu_before = process_tree_cpu_seconds(proc.pid)
        result = parse_wrk(run_wrk(seconds), seconds)
        result["cpu_ms_per_order"] = (process_tree_cpu_seconds(proc.pid) - cpu_before) / result["requests"] * 1000
        return result
    finally:
        stop(proc)


def count_request_queries(user) -> list[str]:
    """Return the SQL one order request runs, through the full Django stack."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from rest_framework.authtoken.models import Token

    client = Client()
    key = Token.objects.get(user=user).key
    with CaptureQueriesContext(connection) as ctx:
        response = client.post(
            "/api/orders/",
            {"goods_name": "profile", "total": 1},
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Token {key}",
            HTTP_IDEMPOTENCY_KEY=f"profile-{time.time_ns()}",
        )
    assert response.status_code == 201, response.content
    return [q["sql"] for q in ctx.captured_queries]


def compare_tracing(token: str, args: argparse.Namespace) -> None:
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
                result = measure_http(token, args.seconds, args.workers, args.threads, **options)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compare-tracing", type=int, default=0, metavar="ROUNDS", help="tracing overhead only")
    parser.add_argument("--baseline-dir", default=None, help="another checkout to measure as the baseline")
    args = parser.parse_args()

    setup_django()
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    user, _ = get_user_model().objects.get_or_create(username="bench")
    token, _ = Token.objects.get_or_create(user=user)
    if args.compare_tracing:
        compare_tracing(token.key, args)
        return

    queries = count_request_queries(user)
    print(f"queries per order request (with Idempotency-Key): {len(queries)}")
    for sql in queries:
        print(f"  {sql[:110]}")
    print(f"ceiling: 8 threads x (2 INSERT + COMMIT) for {args.seconds:.0f}s ...", flush=True)
    ceiling = measure_ceiling(args.seconds)
    print("floor: empty DRF view (bench/floor.py) under the same gunicorn and wrk ...", flush=True)
    floor = measure_http(token.key, args.seconds, args.workers, args.threads, floor=True)
    print(f"http: wrk -c{CLIENTS} against gunicorn ({args.workers} workers x {args.threads} threads) ...", flush=True)
    http = measure_http(token.key, args.seconds, args.workers, args.threads)

    # No relay ran: leave no backlog behind for the next benchmark on this database.
    outbox_backlog_discard("bench_orders: no relay runs during the benchmark")

    ratio = http["orders_per_s"] / ceiling["tx_per_s"]
    floor_ratio = floor["orders_per_s"] / ceiling["tx_per_s"]
    print()
    print("| measure | value |")
    print("|---|---|")
    print(
        f"| raw ceiling (2 INSERT + COMMIT, 8 threads) | {ceiling['tx_per_s']:.0f} tx/s, "
        f"p50 {ceiling['p50_ms']:.2f} ms, p99 {ceiling['p99_ms']:.2f} ms |"
    )
    print(
        f"| framework floor (empty DRF view, no auth, no DB; 8 keep-alive clients) | {floor['orders_per_s']:.0f} "
        f"req/s, p50 {floor['p50_ms']:.2f} ms, p99 {floor['p99_ms']:.2f} ms = {floor_ratio:.0%} of the ceiling |"
    )
    print(
        f"| HTTP POST /api/orders/ (8 keep-alive clients) | {http['orders_per_s']:.0f} orders/s, "
        f"p50 {http['p50_ms']:.2f} ms, p99 {http['p99_ms']:.2f} ms |"
    )
    print(f"| HTTP / ceiling | {ratio:.0%} (target >= 40%) |")
    print(f"| HTTP / framework floor | {http['orders_per_s'] / floor['orders_per_s']:.0%} |")
    print(f"| non-2xx responses | {http['non_2xx']} (socket errors: {http['socket_errors']}) |")
    print(f"| queries per request | {len(queries)} |")
    print(json.dumps({"ceiling": ceiling, "floor": floor, "http": http, "ratio": ratio, "queries": len(queries)}))


if __name__ == "__main__":
    main()
