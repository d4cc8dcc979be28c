"""Benchmark the hot writes' two forms: one multi-statement batch, and one statement per round trip (what they send to
a Galera node, core/sql.Transaction), on the system server and on a node of a three-node Galera cluster.

Each round places ``--orders`` orders (``orders.services.order_create``, with an Idempotency-Key) and awards each
(``credits.services.credit_award``) in this process, through the service's own code: the form is the one the
connection's server asks for, set here on each connection as ``core/sql_batches.galera_node`` would find it. Rounds
alternate the forms. Reported per round and form: wall time per order and per award, this process's CPU and the
database servers' CPU (every node's, where a write set is applied on all three) per operation, from /proc.

    .venv/bin/python bench/bench_galera_writes.py --orders 1000 --rounds 3        # starts and stops its own cluster
"""

import argparse
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import listener_pid, process_tree_cpu_seconds, setup_django  # noqa: E402

FORMS = {"one batch": False, "round trips": True}


def own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def form_set(galera_node: bool) -> None:
    """Make both aliases' connections send the hot writes in this form."""
    from django.db import connections

    from core import sql_batches

    for alias in ("default", "credits"):
        connection = connections[alias]
        connection.ensure_connection()
        setattr(connection.connection, sql_batches._GALERA_NODE, galera_node)


def measure(user, servers: list[int], galera_node: bool, orders: int) -> dict[str, float]:
    from credits.services import credit_award
    from orders.services import order_create
    from outbox.ids import new_transaction_id

    form_set(galera_node)
    results = {}
    placed = []
    for step in ("order", "award"):
        server_before = sum(process_tree_cpu_seconds(pid) for pid in servers)
        own_before, started = own_cpu_seconds(), time.perf_counter()
        if step == "order":
            for _ in range(orders):
                placement = order_create(user=user, goods_name="bench", total=3, idempotency_key=uuid.uuid4().hex)
                placed.append(placement.order.pk)
        else:
            for order_id in placed:
                award = credit_award(transaction_id=new_transaction_id(), order_id=order_id, user_id=user.pk, total=3)
                if not award.created:
                    sys.exit(f"order {order_id} was credited before: a wrong result")
        wall = time.perf_counter() - started
        own = own_cpu_seconds() - own_before
        server = sum(process_tree_cpu_seconds(pid) for pid in servers) - server_before
        results[step] = (wall * 1e3 / orders, own * 1e6 / orders, server * 1e6 / orders)
    return results


def run(target: str, servers: list[int], orders: int, rounds: int) -> None:
    from django.contrib.auth import get_user_model

    from credits.services import credit_balance_ensure

    user = get_user_model().objects.create_user(username=f"bench-galera-{uuid.uuid4().hex[:12]}")
    credit_balance_ensure(user_id=user.pk)
    measure(user, servers, False, min(orders, 100))  # warm-up: connections, statements built, caches
    print(f"\n{target}: per operation, wall ms / this process's CPU us / database servers' CPU us")
    totals = {form: {"order": [], "award": []} for form in FORMS}
    for number in range(rounds):
        for form, galera_node in FORMS.items() if number % 2 == 0 else reversed(FORMS.items()):
            results = measure(user, servers, galera_node, orders)
            for step, figures in results.items():
                totals[form][step].append(figures)
            line = "  ".join(f"{step} {w:.3f} / {c:.0f} / {s:.0f}" for step, (w, c, s) in results.items())
            print(f"  round {number + 1} {form:>11}: {line}", flush=True)
    for step in ("order", "award"):
        ratios = []
        for batch, trips in zip(totals["one batch"][step], totals["round trips"][step], strict=True):
            ratios.append(
                f"wall {trips[0] / batch[0]:.2f}x, ours {trips[1] / batch[1]:.2f}x, server {trips[2] / batch[2]:.2f}x"
            )
        print(f"  {step}, round trips against one batch, each round: " + "; ".join(ratios))


def on_cluster(orders: int, rounds: int) -> None:
    from django.core.management import call_command
    from django.db import connections

    from testkit.galera_cluster import GaleraCluster, cluster_directory

    cluster = GaleraCluster(cluster_directory())
    try:
        cluster.start()
        host, port = cluster.node_address(1)
        server = cluster.connect(1)
        for alias in ("default", "credits"):
            name = connections[alias].settings_dict["NAME"]
            server.cursor().execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci")
            connections[alias].close()
            connections[alias].settings_dict.update(HOST=host, PORT=str(port))
            call_command("migrate", database=alias, verbosity=0)
        server.close()
        pids = [int(cluster.run("pid", str(node)).strip()) for node in (1, 2, 3)]
        run(f"Galera node gal1 at {host}:{port} (three nodes)", pids, orders, rounds)
    finally:
        for alias in ("default", "credits"):
            connections[alias].close()
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--orders", type=int, default=1000, help="orders (and awards) per round and form")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one-server-only", action="store_true", help="skip the Galera cluster")
    args = parser.parse_args()
    setup_django()
    run("the system server (127.0.0.1:3306)", [listener_pid(3306)], args.orders, args.rounds)
    if not args.one_server_only:
        on_cluster(args.orders, args.rounds)


if __name__ == "__main__":
    main()
