"""End-to-end latency: order commit to credit row at a steady order rate, through every real process.

gunicorn, the relay (woken on commit, plus the relay_outbox loop and beat's sweeper) and the credits consumer run
as separate processes; clients place orders at --rate per second for --seconds. Latency is the credit row's
created_at minus the order's created_at, both written by the database host's clock.

Baseline in the same run: the same load with no wake-ups consumed (no worker on the `outbox` queue, no relay loop)
and a relay that drains what is due once a second, the "1-second polling relay" design.

    .venv/bin/python bench/bench_e2e.py [--rate 100] [--seconds 20]
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import BENCH_DATABASE_URL, bench_env, outbox_backlog_discard, percentile, setup_django  # noqa: E402

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


def run(*, rate: float, seconds: float, polling: bool) -> dict:
    from django.contrib.auth import get_user_model

    from accounts.services import api_token_create
    from credits.models import OrderCredit
    from orders.models import Order
    from tests.processes import service_env
    from tests.reliability.conftest import purge_queues
    from tests.reliability.harness import Cluster, Ledger, OrderStream, wait_for_credits

    run_id = time.strftime("%H%M%S") + ("p" if polling else "w")
    users = [get_user_model().objects.create(username=f"e2e-{run_id}-{i}") for i in range(8)]
    tokens = [api_token_create(user=u)[1] for u in users]
    purge_queues()
    if discarded := outbox_backlog_discard("bench_e2e: pending rows left by earlier benchmarks"):
        print(f"discarded {discarded} pending transaction_log rows left by earlier benchmarks", flush=True)

    class E2ECluster(Cluster):
        def commands(self) -> dict[str, list[str]]:
            return {**super().commands(), "poller": [sys.executable, "-c", POLLER]}

    cluster = E2ECluster(
        service_env=service_env(**bench_env()), workdir=Path(tempfile.mkdtemp(prefix="creditshop-e2e-"))
    )
    names = ["web", "credits", "poller"] if polling else ["web", "credits", "outbox", "beat", "relay"]
    ledger = Ledger()
    try:
        cluster.start(*names)
        time.sleep(3)  # workers connected
        stream = OrderStream(cluster.base_url, tokens, rate=rate, ledger=ledger)
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
    return {
        "orders": result.stored,
        "credited": result.credited,
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "max_ms": latencies[-1] if latencies else float("nan"),
        "non_201": sum(n for s, n in ledger.statuses.items() if s != 201),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=100)
    parser.add_argument("--seconds", type=float, default=20)
    args = parser.parse_args()
    setup_django()
    print(f"database {BENCH_DATABASE_URL}; {args.rate:.0f} orders/s for {args.seconds:.0f} s", flush=True)
    woken = run(rate=args.rate, seconds=args.seconds, polling=False)
    polled = run(rate=args.rate, seconds=args.seconds, polling=True)
    print()
    print("| design | orders | credited | commit to credit p50 | p99 | max | non-201 |")
    print("|---|---|---|---|---|---|---|")
    for name, r in (("woken on commit (this service)", woken), ("1-second polling relay (baseline)", polled)):
        print(
            f"| {name} | {r['orders']} | {r['credited']} | {r['p50_ms']:.1f} ms | {r['p99_ms']:.1f} ms "
            f"| {r['max_ms']:.0f} ms | {r['non_201']} |"
        )
    print(f"\np50 speed-up over the polling baseline: {polled['p50_ms'] / woken['p50_ms']:.1f}x")


if __name__ == "__main__":
    main()
