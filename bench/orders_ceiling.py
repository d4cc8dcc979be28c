"""The order benchmark's reference points: the raw database ceiling, the framework floor, the SQL one order
request runs, and a profile of order requests in this process.
"""

import argparse
import json
import threading
import time

from common import outbox_backlog_discard
from wrk import CLIENTS, measure_http

from core.stats import percentile


def measure_ceiling(seconds: float, user_id: int) -> dict:
    """Run two INSERTs and a COMMIT per transaction from 8 threads over mysqlclient; return tx/s and latencies."""
    import MySQLdb
    from django.conf import settings

    from outbox.ids import new_transaction_id

    db = settings.DATABASES["default"]
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


def post_order(client, token: str, idempotency_key: str) -> None:
    """POST one order through the full Django stack in this process (a django.test.Client) and check it was placed."""
    response = client.post(
        "/api/orders/",
        {"goods_name": "profile", "total": 1},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Token {token}",
        HTTP_IDEMPOTENCY_KEY=idempotency_key,
    )
    assert response.status_code == 201, response.content


def count_request_queries(key: str) -> list[str]:
    """Return the SQL one order request with API key `key` runs, through the full Django stack."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        post_order(Client(), key, f"profile-{time.time_ns()}")
    return [q["sql"] for q in ctx.captured_queries]


def ceiling_floor(user, tokens: list[str], args: argparse.Namespace) -> None:
    """Measure the raw database ceiling, the framework floor and the service (no relay running), one run each."""
    queries = count_request_queries(tokens[0])
    print(f"queries per order request (with Idempotency-Key): {len(queries)}")
    for sql in queries:
        print(f"  {sql[:110]}")
    print(f"ceiling: 8 threads x (2 INSERT + COMMIT) for {args.seconds:.0f}s ...", flush=True)
    ceiling = measure_ceiling(args.seconds, user.pk)
    print("floor: empty DRF view (bench/floor.py) under the same gunicorn and wrk ...", flush=True)
    floor = measure_http(tokens, args.seconds, args.workers, args.threads, floor=True)
    print(f"http: wrk -c{CLIENTS} against gunicorn ({args.workers} workers x {args.threads} threads) ...", flush=True)
    http = measure_http(tokens, args.seconds, args.workers, args.threads)

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


def profile_requests(tokens: list[str], requests: int) -> None:
    """Profile `requests` order POSTs through the whole Django stack in this process; print where the CPU goes."""
    import cProfile
    import pstats

    from django.test import Client

    client = Client()

    def post(i: int, prefix: str) -> None:
        post_order(client, tokens[i % len(tokens)], f"{prefix}-{i}")

    run = f"profile-{time.time_ns()}"
    for i in range(50):
        post(i, f"{run}-warm")
    profiler = cProfile.Profile()
    started = time.process_time()
    profiler.enable()
    for i in range(requests):
        post(i, run)
    profiler.disable()
    cpu = time.process_time() - started
    print(f"{requests} requests, {cpu / requests * 1000:.3f} ms CPU each under cProfile (which about doubles it)")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
