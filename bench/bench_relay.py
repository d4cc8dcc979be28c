"""Benchmark the outbox relay: throughput against two baselines, and order-commit-to-broker latency.

In one run, on the same 20,000 Celery task messages:
  1. baseline "one confirm per message": kombu Producer on a confirm_publish connection (what send_task does);
  2. baseline "no database": pre-built messages, one confirm-mode channel, confirms pipelined: the ceiling;
  3. the relay: 20,000 due transaction_log rows, then ``python manage.py relay_outbox --once`` in a subprocess;
  4. latency: orders placed with order_create at a steady rate, a real Celery worker on the outbox queue woken on
     commit, a consumer on the credits queue noting when each order's message arrives.

Usage (it purges the credits and outbox queues of the vhost it is given, so it refuses the default ones):
  DATABASE_URL=mysql://root:@127.0.0.1:3306/creditshop_relay \\
  CELERY_BROKER_URL=amqp://guest:guest@127.0.0.1:5672/relay \\
  python bench/bench_relay.py [--messages 20000] [--rate 100] [--seconds 20]
With --cluster-broker-url URL it compares that quorum-queue cluster with the configured broker (bench/brokers.py).
"""

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import django

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup()

from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.utils import timezone  # noqa: E402
from kombu import Connection, Producer  # noqa: E402

from bench import brokers  # noqa: E402
from config.celery import app  # noqa: E402
from core.contract import CREDITS_QUEUE, OUTBOX_QUEUE  # noqa: E402
from core.stats import percentile  # noqa: E402
from orders.services import order_create  # noqa: E402
from outbox import wakeup  # noqa: E402
from outbox.claims import ClaimedMessage  # noqa: E402
from outbox.ids import new_transaction_id  # noqa: E402
from outbox.messages import build_task_message  # noqa: E402
from outbox.models import TransactionLog  # noqa: E402
from testkit.processes import stop_processes  # noqa: E402

BENCH_BUSINESS = "bench"


def refuse_shared_targets() -> None:
    vhost = settings.CELERY_BROKER_URL.rsplit("/", 1)[-1]
    if connection.settings_dict["NAME"] == "creditshop" or vhost in ("", "/", "%2F"):
        sys.exit("refusing to run against the default database or vhost: this benchmark purges queues")


def queue_channel(conn):
    channel = conn.channel()
    for name in (CREDITS_QUEUE, OUTBOX_QUEUE):
        app.amqp.queues[name](channel).declare()
    return channel


def purge(channel) -> None:
    for name in (CREDITS_QUEUE, OUTBOX_QUEUE):
        channel.queue_purge(name)


def queued(channel, name: str = CREDITS_QUEUE) -> int:
    return channel.queue_declare(name, passive=True).message_count


def wait_queued(channel, n: int, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while (count := queued(channel)) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    return count


def sample_messages(n: int) -> list[ClaimedMessage]:
    messages = []
    for i in range(n):
        tx = new_transaction_id()
        payload = {"schema_version": 1, "transaction_id": tx, "order_id": 10_000_000 + i, "user_id": 1, "total": 3}
        messages.append(ClaimedMessage(tx, payload, 0))
    return messages


def bench_one_confirm_per_message(messages: list[ClaimedMessage], channel) -> float:
    """Publish with kombu on a confirm_publish connection: each publish waits for its own confirm."""
    with app.connection_for_write() as conn:
        producer = Producer(conn.default_channel)
        queue = app.amqp.queues[CREDITS_QUEUE]
        producer.maybe_declare(queue)
        started = time.perf_counter()
        for message in messages:
            headers, properties, body, _ = app.amqp.as_task_v2(
                message.id, "credits.award_credits", args=(), kwargs={"message": message.payload}
            )
            producer.publish(
                body,
                exchange=queue.exchange,
                routing_key=queue.routing_key,
                serializer="json",
                headers=headers,
                delivery_mode=2,
                message_id=message.id,
                **properties,
            )
        elapsed = time.perf_counter() - started
    assert wait_queued(channel, len(messages)) == len(messages)
    purge(channel)
    return len(messages) / elapsed


def bench_no_database(messages: list[ClaimedMessage], channel, window: int, prebuilt: bool = True) -> float:
    """Publish on a raw py-amqp confirm channel, `window` messages per confirm wait, with no database at all.

    prebuilt: the Celery messages are built before the clock starts (the ceiling); otherwise building is timed too.
    """
    built = [build_task_message(m) for m in messages] if prebuilt else None
    with app.connection_for_write(transport_options={"confirm_publish": False}) as conn:
        conn.ensure_connection()
        raw = conn.connection
        raw.client_properties["capabilities"]["connection.blocked"] = False  # as the relay does
        ch = raw.channel()
        ch.confirm_select()
        acked = [0]
        ch.events["basic_ack"].add(lambda tag, multiple: acked.__setitem__(0, max(acked[0], tag)))
        started = time.perf_counter()
        sent = 0
        for i in range(0, len(messages), window):
            chunk = built[i : i + window] if prebuilt else [build_task_message(m) for m in messages[i : i + window]]
            for message in chunk:
                ch.basic_publish(message, exchange=CREDITS_QUEUE, routing_key=CREDITS_QUEUE, mandatory=True)
                sent += 1
            while acked[0] < sent:
                raw.drain_events(timeout=10)
        elapsed = time.perf_counter() - started
    assert wait_queued(channel, len(messages)) == len(messages)
    purge(channel)
    return len(messages) / elapsed


def fill_due_rows(messages: list[ClaimedMessage]) -> None:
    TransactionLog.objects.bulk_create(
        [
            TransactionLog(id=m.id, business=BENCH_BUSINESS, foreign_key=str(m.payload["order_id"]), payload=m.payload)
            for m in messages
        ],
        batch_size=2000,
    )


def run_relay_once() -> tuple[float, str]:
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "manage.py", "relay_outbox", "--once"],
        cwd=BASE_DIR,
        capture_output=True,
        text=True,
        check=True,
    )
    return time.perf_counter() - started, proc.stdout.strip()


def bench_relay(messages: list[ClaimedMessage], channel) -> dict:
    startup, out = run_relay_once()  # nothing due: interpreter + Django start-up + one empty claim
    assert out == "published 0", out
    fill_due_rows(messages)
    elapsed, out = run_relay_once()
    assert out == f"published {len(messages)}", out
    assert wait_queued(channel, len(messages)) == len(messages)
    purge(channel)
    TransactionLog.objects.filter(business=BENCH_BUSINESS).delete()
    n = len(messages)
    return {"wall": elapsed, "startup": startup, "gross": n / elapsed, "net": n / max(elapsed - startup, 1e-9)}


def bench_latency(rate: float, seconds: float, channel, pool: str) -> dict:
    """Place orders at `rate` per second; measure commit to arrival of its message on the credits queue."""
    user, _ = get_user_model().objects.get_or_create(username="bench-relay")
    arrived: dict[str, float] = {}
    committed: dict[str, float] = {}
    stop = threading.Event()
    ready = threading.Event()

    def consume() -> None:
        with Connection(settings.CELERY_BROKER_URL) as conn:
            ch = conn.channel()
            ch.basic_consume(
                CREDITS_QUEUE,
                no_ack=True,
                callback=lambda m: arrived.setdefault(m.properties["message_id"], time.perf_counter()),
            )
            ready.set()
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    conn.drain_events(timeout=0.2)

    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", OUTBOX_QUEUE, "-P", pool, "-c", "2",
         "--without-mingle", "--without-gossip", "--without-heartbeat", "-l", "info"],
        cwd=BASE_DIR,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    consumer = threading.Thread(target=consume, daemon=True)
    try:
        for line in worker.stderr:
            if "ready." in line:
                break
        threading.Thread(target=lambda: [None for _ in worker.stderr], daemon=True).start()
        consumer.start()
        ready.wait(10)
        time.sleep(1.0)  # let every worker process finish starting
        sent_before = wakeup.waker.sent
        total = int(rate * seconds)
        interval = 1.0 / rate
        next_at = time.perf_counter()
        for i in range(total):
            delay = next_at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            placement = order_create(user=user, goods_name=f"bench {i}", total=1)
            committed[placement.order.transaction_id] = time.perf_counter()
            next_at += interval
        deadline = time.monotonic() + 60
        while len(arrived.keys() & committed.keys()) < total and time.monotonic() < deadline:
            time.sleep(0.05)
        wakeups = wakeup.waker.sent - sent_before
    finally:
        stop.set()
        stop_processes(worker, grace=30)
        consumer.join(timeout=5)
    latencies = sorted((arrived[tx] - committed[tx]) * 1000 for tx in committed if tx in arrived)
    purge(channel)
    return {
        "orders": total,
        "delivered": len(latencies),
        "wakeups": wakeups,
        "p50": percentile(latencies, 50),
        "p90": percentile(latencies, 90),
        "p99": percentile(latencies, 99),
        "max": max(latencies),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=100.0, help="orders per second in the latency run")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the latency run")
    parser.add_argument("--repeat", type=int, default=3, help="throughput runs (medians are reported)")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--pool", default="prefork", help="Celery pool of the outbox worker in the latency run")
    brokers.add_arguments(parser)
    args = parser.parse_args()
    if args.cluster_broker_url:
        figure = r"median relay_outbox --once: (\d+) msg/s gross.*"
        sys.exit(
            brokers.compare(
                cluster_url=args.cluster_broker_url, repeat=args.compare_repeat, figure=figure, unit="msg/s"
            )
        )

    refuse_shared_targets()
    call_command("migrate", verbosity=0)
    TransactionLog.objects.filter(business=BENCH_BUSINESS).delete()
    due = TransactionLog.objects.filter(status=TransactionLog.Status.PENDING, next_attempt_at__lte=timezone.now())
    if due.exists():
        sys.exit(f"{due.count()} rows are already due in this database; relay them first")

    with Connection(settings.CELERY_BROKER_URL) as conn:
        channel = queue_channel(conn)
        purge(channel)
        messages = sample_messages(args.messages)
        n = len(messages)
        print(f"outbox relay benchmark: {n} messages, {os.cpu_count()} CPUs, batch {settings.OUTBOX_BATCH_SIZE}")

        if not args.skip_throughput:
            one_confirm = bench_one_confirm_per_message(messages, channel)
            print(f"  baseline one confirm per message (kombu): {one_confirm:8.0f} msg/s")
            # The machine is shared and noisy: alternate ceiling and relay runs and report medians.
            ceilings, built_ceilings, relays = [], [], []
            for run in range(args.repeat):
                window = settings.OUTBOX_BATCH_SIZE
                ceilings.append(max(bench_no_database(messages, channel, w) for w in (window, n)))
                built_ceilings.append(bench_no_database(messages, channel, window, prebuilt=False))
                relays.append(bench_relay(messages, channel))
                r = relays[-1]
                print(
                    f"  run {run + 1}: no-db ceiling {ceilings[-1]:.0f} msg/s,"
                    f" no-db incl. building {built_ceilings[-1]:.0f} msg/s;"
                    f" relay_outbox --once {r['wall']:.2f} s wall ({r['startup']:.2f} s start-up)"
                    f" -> {r['gross']:.0f} msg/s gross, {r['net']:.0f} net;"
                    f" {100 * r['gross'] / ceilings[-1]:.0f}% of this run's ceiling gross"
                )
            ceiling, built_ceiling = statistics.median(ceilings), statistics.median(built_ceilings)
            gross = statistics.median(r["gross"] for r in relays)
            net = statistics.median(r["net"] for r in relays)
            # Load from other processes moves every figure run to run; a run's relay-to-ceiling ratio moves less.
            gross_ratio = statistics.median(r["gross"] / c for r, c in zip(relays, ceilings, strict=True))
            net_ratio = statistics.median(r["net"] / c for r, c in zip(relays, ceilings, strict=True))
            built_ratio = statistics.median(r["net"] / c for r, c in zip(relays, built_ceilings, strict=True))
            print(f"  median no-database ceiling (pre-built messages): {ceiling:8.0f} msg/s")
            print(f"  median no-database, building messages too:      {built_ceiling:8.0f} msg/s")
            print(f"  median relay_outbox --once: {gross:.0f} msg/s gross (wall incl. start-up), {net:.0f} msg/s net")
            print(
                f"  relay vs one-confirm: {gross / one_confirm:.1f}x gross; median per-run share of the ceiling:"
                f" {100 * gross_ratio:.0f}% gross, {100 * net_ratio:.0f}% net;"
                f" of no-db incl. building: {100 * built_ratio:.0f}% net"
            )
        if not args.skip_latency:
            latency = bench_latency(args.rate, args.seconds, channel, args.pool)
            print(
                f"  latency at {args.rate:.0f} orders/s for {args.seconds:.0f} s (outbox worker -P {args.pool} -c 2):"
                f" {latency['delivered']}/"
                f"{latency['orders']} delivered, {latency['wakeups']} wake-up tasks;"
                f" commit->broker p50 {latency['p50']:.1f} ms, p90 {latency['p90']:.1f} ms,"
                f" p99 {latency['p99']:.1f} ms, max {latency['max']:.1f} ms"
            )


if __name__ == "__main__":
    main()
