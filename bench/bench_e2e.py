"""End-to-end latency: order commit to credit row at a steady order rate, through every real process.

gunicorn, the relay (woken on commit, plus the relay_outbox loop and beat's sweeper) and the credits consumers (two
solo workers as deployed, or with --pool prefork one prefork worker of two processes) run as separate processes;
clients place orders at --rate per second for --seconds, or, with --burst N, in --bursts bursts of N orders sent at
once (each burst credited before the next). Latency is the credit row's created_at minus the order's created_at,
both written by the database host's clock.

"Relayed" is the outbox row's published_at (the relay's mark, after the broker's confirm) minus the order's
created_at: the part of the latency before the consumer.

Baseline in the same run: the same load with no wake-ups consumed (no worker on the `outbox` queue, no relay loop)
and a relay that drains what is due once a second, the "1-second polling relay" design.

    .venv/bin/python bench/bench_e2e.py [--rate 100] [--seconds 20] [--repeat 1]
    .venv/bin/python bench/bench_e2e.py --burst 150 --bursts 10 [--repeat 1] [--skip-baseline] [--pool prefork]
        [--web-nice 0]

The web runs at niceness 5 (WEB_NICE), below the relay and the consumers, as docs/OPERATIONS.md deploys it on a host
they share; ``--web-nice 0`` runs all at the same priority.
"""

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import BENCH_DATABASE_URL, bench_env, outbox_backlog_discard, setup_django  # noqa: E402

from core.stats import percentile  # noqa: E402

# The web's niceness on a host shared with the relay and the consumers (docs/OPERATIONS.md: systemd Nice=5).
WEB_NICE = 5

POLLER = """
import os, time, django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup()
from outbox.drain import drain
from outbox.publisher import Publisher
publisher = Publisher()
while True:
    drain(publisher)
    time.sleep(1.0)
"""


def place_bursts(stream, *, size: int, bursts: int, user_ids: list[int]) -> None:
    """Send `bursts` bursts of `size` orders, each order from its own thread released at the same instant."""
    import requests

    from testkit.reconcile import wait_for_credits

    sessions = []  # one client (keep-alive connection) per slot, kept from burst to burst
    for slot in range(size):
        session = requests.Session()
        session.headers["Authorization"] = f"Token {stream.tokens[slot % len(stream.tokens)]}"
        sessions.append(session)
    for number in range(bursts):
        barrier = threading.Barrier(size)

        def place(slot: int, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            stream._place(sessions[slot], total=1 + slot % 50)

        threads = [threading.Thread(target=place, args=(slot,)) for slot in range(size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wait_for_credits(stream.ledger, user_ids, timeout=60)
        print(f"  burst {number + 1}/{bursts}: {size} orders answered and credited", flush=True)
        time.sleep(1.0)  # the next burst starts in a fresh rate-limit window


def run(
    *,
    rate: float,
    seconds: float,
    polling: bool,
    burst: int = 0,
    bursts: int = 0,
    pool: str = "solo",
    web_nice: int = WEB_NICE,
) -> dict:
    from django.contrib.auth import get_user_model

    from accounts.services import api_token_create
    from core.contract import BUSINESS_ORDER
    from credits.models import OrderCredit
    from orders.models import Order
    from outbox.models import TransactionLog
    from testkit.harness import Cluster
    from testkit.load import Ledger, OrderStream
    from testkit.processes import service_env
    from testkit.queues import purge_queues
    from testkit.reconcile import wait_for_credits

    run_id = time.strftime("%H%M%S") + ("p" if polling else "w")
    # Bursts spread over more users so that no user passes the rate limit (20/second by default).
    users = [get_user_model().objects.create(username=f"e2e-{run_id}-{i}") for i in range(16 if burst else 8)]
    tokens = [api_token_create(user=u)[1] for u in users]
    purge_queues()
    if discarded := outbox_backlog_discard("bench_e2e: pending rows left by earlier benchmarks"):
        print(f"discarded {discarded} pending transaction_log rows left by earlier benchmarks", flush=True)

    class E2ECluster(Cluster):
        def commands(self) -> dict[str, list[str]]:
            commands = {**super().commands(), "poller": [sys.executable, "-c", POLLER]}
            if pool == "solo":
                # As deployed (docs/OPERATIONS.md): one solo consumer per core, not a prefork pool of two.
                solo = [str(Path(sys.executable).parent / "celery"), "-A", "config", "worker", "-Q", "credits", "-P"]
                commands["credits"] = [*solo, "solo", "-n", "credits1@%h", "-l", "INFO"]
                commands["credits2"] = [*solo, "solo", "-n", "credits2@%h", "-l", "INFO"]
            if web_nice:
                # The web below the relay and the consumers on a shared host (docs/OPERATIONS.md, systemd Nice=).
                commands["web"] = ["nice", "-n", str(web_nice), *commands["web"]]
            return commands

    cluster = E2ECluster(
        service_env=service_env(**bench_env()), workdir=Path(tempfile.mkdtemp(prefix="creditshop-e2e-"))
    )
    consumers = ["credits", "credits2"] if pool == "solo" else ["credits"]
    names = ["web", *consumers, "poller"] if polling else ["web", *consumers, "outbox", "beat", "relay"]
    ledger = Ledger()
    try:
        cluster.start(*names)
        time.sleep(3)  # workers connected
        stream = OrderStream(cluster.base_url, tokens, rate=rate, ledger=ledger)
        if burst:
            place_bursts(stream, size=burst, bursts=bursts, user_ids=[u.pk for u in users])
        else:
            stream.start()
            time.sleep(seconds)
            stream.stop()
        result, _ = wait_for_credits(ledger, [u.pk for u in users], timeout=60)
    finally:
        cluster.stop()
    # Two databases: each side's commit time read from its own, paired here (both written by one host's clock).
    ordered_at = dict(Order.objects.filter(user_id__in=[u.pk for u in users]).values_list("id", "created_at"))
    credited_at = OrderCredit.objects.filter(order_id__in=list(ordered_at)).values_list("order_id", "created_at")
    latencies = sorted((at - ordered_at[order_id]).total_seconds() * 1000 for order_id, at in credited_at)
    # Where the time goes: commit to the relay's mark (after the broker's confirm), one database's clock.
    marked_at = TransactionLog.objects.filter(
        business=BUSINESS_ORDER, foreign_key__in=[str(order_id) for order_id in ordered_at]
    ).values_list("foreign_key", "published_at")
    relayed = sorted(
        (at - ordered_at[int(order_id)]).total_seconds() * 1000 for order_id, at in marked_at if at is not None
    )
    return {
        "orders": result.stored,
        "credited": result.credited,
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "max_ms": latencies[-1] if latencies else float("nan"),
        "relayed_p50_ms": percentile(relayed, 50),
        "relayed_p99_ms": percentile(relayed, 99),
        "non_201": sum(n for s, n in ledger.statuses.items() if s != 201),
        "statuses": dict(ledger.statuses),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=100)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--burst", type=int, default=0, help="orders sent at once in each burst (0: a steady rate)")
    parser.add_argument("--bursts", type=int, default=10, help="how many bursts, with --burst")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each design, interleaved")
    parser.add_argument("--skip-baseline", action="store_true", help="run this service's design only")
    parser.add_argument(
        "--pool", choices=("solo", "prefork"), default="solo", help="two solo consumers (as deployed) or prefork -c 2"
    )
    parser.add_argument(
        "--web-nice",
        type=int,
        default=WEB_NICE,
        help=f"run gunicorn at this niceness, the relay and consumers at 0 (default {WEB_NICE}, as deployed)",
    )
    args = parser.parse_args()
    if args.burst < 0 or args.bursts < 1 or args.repeat < 1:
        parser.error("--burst must be >= 0, --bursts and --repeat >= 1")
    setup_django()
    load = (
        f"{args.bursts} bursts of {args.burst} orders"
        if args.burst
        else f"{args.rate:.0f} orders/s for {args.seconds:.0f} s"
    )
    print(f"database {BENCH_DATABASE_URL}; {load}; the web at niceness {args.web_nice}", flush=True)
    rows = []
    designs = [("woken on commit (this service)", False), ("1-second polling relay (baseline)", True)]
    if args.skip_baseline:
        designs = designs[:1]
    for round_number in range(1, args.repeat + 1):
        for name, polling in designs:
            load = {"rate": args.rate, "seconds": args.seconds, "burst": args.burst, "bursts": args.bursts}
            result = run(polling=polling, pool=args.pool, web_nice=args.web_nice, **load)
            rows.append((round_number, name, result))
    print()
    print("| run | design | orders | credited | commit to credit p50 | p99 | max | to relayed p50 | p99 | non-201 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for round_number, name, r in rows:
        print(
            f"| {round_number} | {name} | {r['orders']} | {r['credited']} | {r['p50_ms']:.1f} ms "
            f"| {r['p99_ms']:.1f} ms | {r['max_ms']:.0f} ms | {r['relayed_p50_ms']:.1f} ms "
            f"| {r['relayed_p99_ms']:.1f} ms | {r['non_201']} |"
        )
    print("answers to every attempt (a refused one is retried with its Idempotency-Key):")
    for round_number, name, r in rows:
        print(f"  run {round_number}, {name}: {r['statuses']}")
    for round_number in range(1, args.repeat + 1 if not args.skip_baseline else 1):
        woken, polled = (r for n, _, r in rows if n == round_number)
        print(f"run {round_number}: p50 speed-up over the polling baseline {polled['p50_ms'] / woken['p50_ms']:.1f}x")


if __name__ == "__main__":
    main()
