"""Benchmark: how fast the credits consumer drains a backlog of queued messages, and that it awards each order once.

It writes N orders with their transaction_log rows (bulk, as seed data), publishes each row's payload to the
`credits` queue exactly as the relay does (plus optional re-deliveries), then starts real
`celery -A config worker -Q credits` processes and times the drain from the database's own timestamps.

    export DATABASE_URL=mysql://root:@127.0.0.1:3306/creditshop_credits
    export CELERY_BROKER_URL=amqp://guest:guest@127.0.0.1:5672/credits
    python manage.py migrate
    DJANGO_DEBUG=false python bench/bench_credits.py --messages 20000 --processes 2 --pool solo

With --cluster-broker-url URL it compares that quorum-queue cluster with the configured broker (bench/brokers.py).

Exit status 1 when an order is credited twice or not at all, or a balance disagrees with its entries.
"""

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.db import connection  # noqa: E402
from kombu import Connection  # noqa: E402

from bench import brokers  # noqa: E402
from config.celery import CREDITS_DEAD_QUEUE, CREDITS_QUEUE, app  # noqa: E402
from credits.models import CreditBalance, DeadLetter, OrderCredit  # noqa: E402
from orders.models import Order  # noqa: E402
from orders.services import BUSINESS_ORDER  # noqa: E402
from outbox.ids import new_transaction_id  # noqa: E402
from outbox.models import TransactionLog  # noqa: E402
from outbox.services import SCHEMA_VERSION  # noqa: E402

USER_PREFIX = "bench-credits-"
BATCH = 2000


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
    brokers.add_arguments(parser)
    return parser.parse_args()


def bench_cleanup() -> None:
    """Delete every row an earlier run of this bench wrote."""
    users = get_user_model().objects.filter(username__startswith=USER_PREFIX)
    orders = Order.objects.filter(user__in=users)
    OrderCredit.objects.filter(user__in=users).delete()
    CreditBalance.objects.filter(user__in=users).delete()
    DeadLetter.objects.filter(order_id__in=orders.values("pk")).delete()
    TransactionLog.objects.filter(
        business=BUSINESS_ORDER, foreign_key__in=[str(pk) for pk in orders.values_list("pk", flat=True)]
    ).delete()
    orders.delete()
    users.delete()


def orders_seed(*, messages: int, users: int) -> list[dict]:
    """Write the orders and their transaction_log rows in bulk; return the payloads the relay would publish."""
    user_model = get_user_model()
    user_model.objects.bulk_create([user_model(username=f"{USER_PREFIX}{i}") for i in range(users)])
    user_ids = list(user_model.objects.filter(username__startswith=USER_PREFIX).values_list("pk", flat=True))
    payloads = []
    for start in range(0, messages, BATCH):
        orders = [
            Order(
                user_id=random.choice(user_ids),
                goods_name="bench",
                total=random.randint(1, 100),
                transaction_id=new_transaction_id(),
            )
            for _ in range(min(BATCH, messages - start))
        ]
        Order.objects.bulk_create(orders)  # MariaDB returns the new ids (INSERT ... RETURNING)
        logs = []
        for order in orders:
            payload = {
                "schema_version": SCHEMA_VERSION,
                "transaction_id": order.transaction_id,
                "order_id": order.pk,
                "user_id": order.user_id,
                "total": order.total,
            }
            payloads.append(payload)
            logs.append(
                TransactionLog(
                    id=order.transaction_id,
                    business=BUSINESS_ORDER,
                    foreign_key=str(order.pk),
                    payload=payload,
                    status=TransactionLog.Status.PUBLISHED,
                )
            )
        TransactionLog.objects.bulk_create(logs)
    return payloads


def broker_prepare() -> None:
    """Declare and empty the credits queues; refuse to run while another consumer is attached."""
    with Connection(settings.CELERY_BROKER_URL) as conn:
        channel = conn.default_channel
        for name in (CREDITS_QUEUE, CREDITS_DEAD_QUEUE):
            queue = app.amqp.queues[name].bind(channel)
            queue.declare()
            if name == CREDITS_QUEUE and queue.queue_declare(passive=True).consumer_count:
                raise SystemExit("another consumer is attached to the credits queue; stop it first")
            queue.purge()


def publish_all(payloads: list[dict], *, duplicates: float) -> int:
    """Publish every payload as the relay does, plus re-deliveries of a random share; return how many were sent."""
    deliveries = payloads + random.sample(payloads, int(len(payloads) * duplicates))
    random.shuffle(deliveries)
    with app.producer_or_acquire() as producer:
        for payload in deliveries:
            app.send_task(
                "credits.award_credits",
                kwargs={"message": payload},
                task_id=payload["transaction_id"],
                queue=CREDITS_QUEUE,
                producer=producer,
            )
    return len(deliveries)


def workers_start(args: argparse.Namespace, log_dir: Path) -> list[subprocess.Popen]:
    """Start the workers: one prefork worker with N processes, or N solo workers."""
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
                    cwd=settings.BASE_DIR,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    return processes


def workers_stop(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def cpu_seconds(pid: int) -> float:
    """Return the user + system CPU time a process has used so far (NaN once it has exited)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:  # a short-lived process taken for a server (rabbitmqctl's VM is a beam.smp too)
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """Return the CPU time of a process and its live children (the prefork pool)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return cpu_seconds(pid) + sum(cpu_seconds(int(child)) for child in children)


def server_pids() -> dict[str, int]:
    """Return the pids of the local MariaDB and RabbitMQ servers, to account for their CPU time too."""
    found = {}
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            name = comm.read_text().strip()
        except OSError:
            continue
        if name in ("mariadbd", "mysqld"):
            found["MariaDB"] = int(comm.parent.name)
        elif name == "beam.smp":
            found["RabbitMQ"] = int(comm.parent.name)
    return found


def bench_credits(order_range: tuple[int, int]):
    return OrderCredit.objects.filter(order_id__gte=order_range[0], order_id__lte=order_range[1])


def main() -> int:
    args = parse_args()
    if args.cluster_broker_url:
        figure = r"drain rate:\s+([\d,]+) awards/s"
        return brokers.compare(
            cluster_url=args.cluster_broker_url, repeat=args.compare_repeat, figure=figure, unit="awards/s"
        )
    random.seed(20_000)
    bench_cleanup()
    print(f"seeding {args.messages} orders for {args.users} users ...", flush=True)
    payloads = orders_seed(messages=args.messages, users=args.users)
    order_range = (payloads[0]["order_id"], payloads[-1]["order_id"])
    broker_prepare()
    started = time.monotonic()
    sent = publish_all(payloads, duplicates=args.duplicates)
    print(f"published {sent} messages in {time.monotonic() - started:.1f}s", flush=True)

    log_dir = Path(tempfile.gettempdir())
    servers = server_pids()
    servers_cpu = {name: cpu_seconds(pid) for name, pid in servers.items()}
    processes = workers_start(args, log_dir)
    started = time.monotonic()
    warm_cpu = None
    try:
        while (done := bench_credits(order_range).count()) < args.messages:
            if warm_cpu is None and done:
                # Worker CPU once the first award landed: start-up excluded from the steady-state figure below.
                warm_cpu, warm_done = sum(tree_cpu_seconds(p.pid) for p in processes), done
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
        workers_cpu = sum(tree_cpu_seconds(p.pid) for p in processes)
        steady_cpu = (workers_cpu - warm_cpu) / (sent - warm_done) if warm_cpu is not None else float("nan")
        servers_cpu = {name: cpu_seconds(pid) - servers_cpu[name] for name, pid in servers.items()}
    finally:
        workers_stop(processes)

    credits = bench_credits(order_range)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COUNT(*), COUNT(DISTINCT order_id), TIMESTAMPDIFF(MICROSECOND, MIN(created_at), MAX(created_at))"
            " FROM order_credits WHERE order_id BETWEEN %s AND %s",
            order_range,
        )
        rows, distinct_orders, span_us = cursor.fetchone()
        cursor.execute(
            "SELECT COUNT(*) FROM credit_balances b LEFT JOIN"
            " (SELECT user_id, SUM(total) AS total FROM order_credits GROUP BY user_id) c ON c.user_id = b.user_id"
            " JOIN auth_user u ON u.id = b.user_id"
            " WHERE u.username LIKE %s AND b.balance <> COALESCE(c.total, 0)",
            [f"{USER_PREFIX}%"],
        )
        wrong_balances = cursor.fetchone()[0]
    expected_total = 2 * sum(p["total"] for p in payloads)
    awarded_total = sum(credits.values_list("total", flat=True))
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
        f"worker cpu/award:   {steady_cpu * 1e3:.2f} ms steady state, {workers_cpu / sent * 1e3:.2f} ms with start-up"
    )
    print(
        "server cpu/award:   "
        + ", ".join(f"{name} {seconds / sent * 1e3:.2f} ms" for name, seconds in servers_cpu.items())
        + " (whole servers: includes anything else they served meanwhile)"
    )
    print(f"load average:       {os.getloadavg()[0]:.2f} (1 min; 2 cores shared with other work)")
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
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
