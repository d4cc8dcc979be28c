"""Long soak under faults: a steady stream of retried orders while workers, the relay, the broker, database
connections and the credits database's server are killed in turn, and each dependency goes silent in turn (its
packets dropped, no reset: testkit/silence.py), then a Jepsen-style summary of what was attempted, acknowledged, lost
and duplicated.

    .venv/bin/python bench/soak.py --minutes 10 [--rate 30] [--fault-every 15] [--credits-outage 20]
        [--silence-seconds 60]

A silence puts every process's link to one dependency (the orders database, the credits database, the broker or
Redis) behind a SilentLink for --silence-seconds; the summary gives, per silence, the longest order request, the
answers that were neither a 201 nor a 503 and, for the orders database, how long after the heal the first 201 came.
`--faults silence-orders-database --silence-seconds 600` is the ten-minute partition, past TCP's retransmissions and
the AMQP heartbeats. Silences need iptables and root.

The order service uses its own database (BENCH_DATABASE_URL, default creditshop_bench). The credits service's
database lives on a private MariaDB server the soak starts for the run (testkit/mariadb_server.py) and crashes as one
of its faults. The relay and the workers log in with users confined to their own service's tables
(testkit/database_users.py). It uses the broker of CELERY_BROKER_URL and stops RabbitMQ's app (rabbitmqctl stop_app /
start_app) during the run: do not point it at a shared broker.

With --rabbitmq-cluster DIR it starts the three-node cluster of scripts/rabbitmq_cluster.sh in DIR instead, runs
on quorum queues, and the broker faults become node faults: SIGKILL of the node leading `credits` (restarted after
a pause), and a graceful stop of the node leading it then (started again after a pause). It stops the cluster at
the end.

With --rolling-restart, after the faults (or alone, with --minutes 0) it restarts every process type in turn the way
an operator does (testkit/restarts.py), orders still flowing through two gunicorn instances: a gapless
reload (TTIN, TTOU) and a HUP of gunicorn, each gunicorn stopped and started while the other serves, then the relay,
the outbox, credits and analytics workers and beat on SIGTERM (the analytics worker in the middle of a nightly run).
It prints each process's stop time and the order p99 during each restart.

    .venv/bin/python bench/soak.py --minutes 0 --rolling-restart
"""

import argparse
import itertools
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import setup_django  # noqa: E402
from soak_rolling import rolling_restart, rolling_restart_report  # noqa: E402

from testkit.mariadb_server import MariaDBServer  # noqa: E402
from testkit.processes import free_port  # noqa: E402

CREDITS_DATABASE = "creditshop_bench_credits"
SILENCES = ("silence-orders-database", "silence-credits-database", "silence-broker", "silence-redis")
FAULTS = ("consumer", "relay", "broker", "connections", "credits-database", *SILENCES)
# What a silence may cost an order request, and how soon after the heal orders must be taken again (issue targets,
# docs/RELIABILITY.md).
ANSWER_LIMIT_SECONDS = 5.0
FIRST_ORDER_AFTER_HEAL_LIMIT_SECONDS = 5.0
RESUME_LIMIT_SECONDS = 15.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=5)
    parser.add_argument("--rate", type=float, default=30, help="orders per second across all clients")
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--fault-every", type=float, default=15, help="seconds between faults")
    parser.add_argument("--drain-limit", type=float, default=60)
    parser.add_argument(
        "--credits-outage", type=float, default=20, help="seconds the credits database's server stays down"
    )
    parser.add_argument("--silence-seconds", type=float, default=60, help="seconds a silenced dependency stays silent")
    parser.add_argument(
        "--faults",
        default=",".join(FAULTS),
        help=f"comma-separated faults to cycle through, in order (default: all of {', '.join(FAULTS)})",
    )
    parser.add_argument("--rabbitmq-cluster", metavar="DIR", help="run on a three-node quorum-queue cluster in DIR")
    parser.add_argument(
        "--rolling-restart", action="store_true", help="then restart every process type in turn (see above)"
    )
    args = parser.parse_args()
    if unknown := set(args.faults.split(",")) - set(FAULTS):
        parser.error(f"unknown faults: {', '.join(sorted(unknown))}")
    if args.rabbitmq_cluster and "silence-broker" in args.faults.split(","):
        parser.error("silence-broker needs the single broker: a cluster's clients fail over to another node")

    credits_server = MariaDBServer(port=free_port())
    credits_server.install()
    credits_server.start()
    try:
        return soak(args, credits_server)
    finally:
        credits_server.remove()


def address(url: str, default_port: int) -> tuple[str, int]:
    """Return the (host, port) a URL names."""
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or default_port


def soak(args: argparse.Namespace, credits_server: MariaDBServer) -> int:
    credits_server.create_database(CREDITS_DATABASE)
    # Over the bench's own credits database: the credits service's database is on the server the soak crashes.
    setup_django(CREDITS_DATABASE_URL=credits_server.url(CREDITS_DATABASE))
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from tqdm import tqdm

    from accounts.services import api_token_create
    from testkit.database_users import ProcessUsers
    from testkit.db_faults import kill_database_connections
    from testkit.harness import Cluster
    from testkit.load import Backends, Ledger, OrderStream
    from testkit.processes import database_address, service_env
    from testkit.queues import purge_queues, rabbitmqctl
    from testkit.reconcile import wait_for_credits, wait_until_credited
    from testkit.silence import SilentLink

    call_command("migrate", database="credits", verbosity=0)

    run = time.strftime("%Y%m%d%H%M%S")
    users = [get_user_model().objects.create(username=f"soak-{run}-{i}") for i in range(args.clients)]
    tokens = [api_token_create(user=u)[1] for u in users]
    user_ids = [u.pk for u in users]
    broker_url, extra_env, rabbit = settings.CELERY_BROKER_URL, {}, None
    if args.rabbitmq_cluster:
        from core.contract import CREDITS_QUEUE, QUEUE_TYPE_QUORUM
        from testkit.rabbitmq_cluster import RabbitCluster

        rabbit = RabbitCluster(Path(args.rabbitmq_cluster))
        rabbit.start()
        rabbit.queues_recreate(max_retries=settings.CREDITS_MAX_RETRIES)
        broker_url, extra_env = rabbit.broker_url, {"CELERY_QUEUE_TYPE": QUEUE_TYPE_QUORUM}
    else:
        purge_queues()
    workdir = Path(tempfile.mkdtemp(prefix="creditshop-soak-"))
    process_users = ProcessUsers()
    process_users.create()
    env, process_env = service_env(CELERY_BROKER_URL=broker_url, **extra_env), process_users.cluster_env()
    # Every process reaches a dependency the run may silence through that dependency's link.
    link_targets = {
        "silence-orders-database": ("DATABASE_URL", database_address("default")),
        "silence-credits-database": ("CREDITS_DATABASE_URL", database_address("credits")),
        "silence-broker": ("CELERY_BROKER_URL", address(broker_url, 5672)),
        "silence-redis": ("REDIS_URL", address(settings.REDIS_URL, 6379)),
    }
    links: dict[str, SilentLink] = {}
    for name in set(args.faults.split(",")) & set(SILENCES):
        variable, upstream = link_targets[name]
        links[name] = link = SilentLink(upstream)
        link.up()
        env[variable] = link.through(env.get(variable, getattr(settings, variable, "")))
        for variables in process_env.values():
            if variable in variables:
                variables[variable] = link.through(variables[variable])
    cluster = Cluster(
        service_env=env,
        workdir=workdir,
        port=free_port(),
        process_env=process_env,
        second_port=free_port() if args.rolling_restart else None,
    )
    # A Spark master that never answers keeps the rolling restart's nightly run in progress until its worker stops.
    cluster.process_env["analytics"] = {"SPARK_MASTER": "spark://127.0.0.1:9", "SPARK_DRIVER_MEMORY": "512m"}

    def kill_consumer():
        return f"SIGKILL {cluster.kill_pool_children('credits')} consumer pool processes"

    def kill_relay():
        cluster.kill("relay")
        time.sleep(1)
        cluster.start("relay")
        return "SIGKILL relay_outbox, restarted after 1 s"

    def broker_outage():
        rabbitmqctl("stop_app")
        time.sleep(min(10, args.fault_every / 2))
        rabbitmqctl("start_app")
        return "rabbitmqctl stop_app, start_app"

    def kill_connections():
        return f"KILL {kill_database_connections(connection.settings_dict['NAME'])} database connections"

    credits_outages: list[tuple[float, float, float]] = []  # (down at, back at, seconds until the backlog was credited)

    def credits_database_outage():
        down_at = time.monotonic()
        credits_server.kill()
        time.sleep(args.credits_outage)
        credits_server.start()
        back_at = time.monotonic()
        with ledger.lock:
            backlog = {order_id for order_id, _ in ledger.acknowledged.values()}
        caught_up_in = wait_until_credited(backlog, timeout=args.drain_limit)
        credits_outages.append((down_at, back_at, caught_up_in))
        return f"SIGKILL the credits database's server, restarted after {args.credits_outage:.0f} s"

    def node_crash():
        leader = rabbit.leader(CREDITS_QUEUE)
        rabbit.kill_node(leader)
        time.sleep(min(10, args.fault_every / 2))
        rabbit.start_node(leader)
        return "SIGKILL the node leading credits, restarted"

    def node_stop():
        leader = rabbit.leader(CREDITS_QUEUE)
        rabbit.stop_node(leader)
        time.sleep(min(10, args.fault_every / 2))
        rabbit.start_node(leader)
        return "graceful stop of the node leading credits, started again"

    # (fault, silent at, healed at, seconds from the heal to the first credit awarded after it)
    silences: list[tuple[str, float, float, float | None]] = []

    def credits_awarded() -> int:
        from credits.models import OrderCredit

        return OrderCredit.objects.filter(user_id__in=user_ids).count()

    def silence(name: str):
        def fault():
            silent_at = time.monotonic()
            with links[name].silenced():
                time.sleep(args.silence_seconds)
            healed_at = time.monotonic()
            # The first credit after the heal: the relay, the broker and a consumer all work again.
            before, resumed = credits_awarded(), None
            while resumed is None and time.monotonic() < healed_at + args.drain_limit:
                if credits_awarded() > before:
                    resumed = time.monotonic() - healed_at
                time.sleep(0.2)
            silences.append((name, silent_at, healed_at, resumed))
            return f"{name} for {args.silence_seconds:.0f} s (packets dropped both ways)"

        return fault

    # On a RabbitMQ cluster the broker fault is a node fault: a crash, then a graceful stop, in turn.
    broker_faults = [node_crash, node_stop] if rabbit else [broker_outage]
    by_name = dict(
        zip(
            FAULTS,
            [kill_consumer, kill_relay, None, kill_connections, credits_database_outage, *map(silence, SILENCES)],
            strict=True,
        )
    )
    schedule = []
    for name in args.faults.split(","):
        schedule.extend(broker_faults if name == "broker" else [by_name[name]])
    faults = itertools.cycle(schedule)
    injected: list[str] = []
    ledger = Ledger()
    restarts, earlier_nightly = [], 0
    cluster.start()
    backends = Backends(*cluster.web_urls.values())
    stream = OrderStream(backends, tokens, rate=args.rate, ledger=ledger)
    try:
        stream.start()
        started = time.monotonic()
        deadline = started + args.minutes * 60
        last_fault_end = started
        with tqdm(total=int(args.minutes * 60), desc="soak", unit="s") as bar:
            next_fault = started + args.fault_every
            while time.monotonic() < deadline:
                time.sleep(1)
                bar.update(min(bar.total, int(time.monotonic() - started)) - bar.n)
                bar.set_postfix(acked=len(ledger.acknowledged), faults=len(injected))
                if time.monotonic() >= next_fault:
                    injected.append(next(faults)())
                    last_fault_end = next_fault = time.monotonic()
                    next_fault += args.fault_every
        if args.rolling_restart:
            restarts, earlier_nightly = rolling_restart(cluster, backends)
            last_fault_end = time.monotonic()
        stream.stop()
        result, _ = wait_for_credits(ledger, user_ids, timeout=args.drain_limit)
        drained_in = time.monotonic() - last_fault_end
    finally:
        stream.stop()
        cluster.stop()
        for link in links.values():
            link.down()
        process_users.drop()
        if rabbit is not None:
            rabbit.stop()

    print()
    print(f"faults injected:   {len(injected)}")
    for line in sorted(set(injected)):
        print(f"  {injected.count(line):3d} x {line}")
    print(f"client responses:  {dict(ledger.statuses)}")
    print(f"supervisor restarts: {dict(cluster.restarts) or 'none'}")
    print(f"attempted:         {result.attempted}")
    print(f"acknowledged:      {result.acknowledged}")
    print(f"stored:            {result.stored}")
    print(f"lost:              {result.lost}")
    print(f"duplicated:        {result.duplicated_credits} credits, {result.unacknowledged_stored} unacked orders")
    print(f"wrong amounts:     {result.wrong_amounts}")
    print(f"balance mismatch:  {result.balance_mismatches}")
    print(f"dead letters:      {result.dead_letters}")
    for down_at, back_at, caught_up_in in credits_outages:
        p99, count = ledger.latency_p99(since=down_at, until=back_at)
        print(
            f"credits db down:   {back_at - down_at:.1f} s, {count} orders acknowledged meanwhile (p99"
            f" {p99 * 1000:.1f} ms), backlog credited {caught_up_in:.1f} s after the server returned"
        )
    silence_problems = []
    for name, silent_at, healed_at, credits_resumed in silences:
        with ledger.lock:
            during = [r for r in ledger.requests if silent_at <= r[0] <= healed_at + 10]
            first_201 = min((at for at, _, status in ledger.requests if status == 201 and at > healed_at), default=None)
        longest = max((seconds for _, seconds, _ in during), default=0.0)
        unanswered = sum(1 for _, _, status in during if status not in (201, 503))
        resumed = "never" if first_201 is None else f"{first_201 - healed_at:.1f} s"
        credited = "never" if credits_resumed is None else f"{credits_resumed:.1f} s"
        print(
            f"{name}: {healed_at - silent_at:.0f} s, {len(during)} requests, longest {longest:.2f} s,"
            f" {unanswered} neither 201 nor 503, first 201 {resumed} and first credit {credited} after the heal"
        )
        if longest >= ANSWER_LIMIT_SECONDS or unanswered:
            silence_problems.append(f"{name}: a request took {longest:.1f} s or got no answer ({unanswered})")
        if first_201 is None or first_201 - healed_at >= FIRST_ORDER_AFTER_HEAL_LIMIT_SECONDS:
            silence_problems.append(f"{name}: orders were not taken again within 5 s of the heal ({resumed})")
        if credits_resumed is None or credits_resumed >= RESUME_LIMIT_SECONDS:
            silence_problems.append(f"{name}: no credit within 15 s of the heal ({credited})")
    for problem in silence_problems:
        print(f"  PROBLEM: {problem}")
    restart_problems = rolling_restart_report(restarts, ledger, earlier_nightly) if args.rolling_restart else []
    p99_all, _ = ledger.latency_p99()
    print(f"order latency p99: {p99_all * 1000:.1f} ms over the whole run")
    print(f"recovered:         {result.credited} of {result.stored} orders credited")
    print(f"drain time:        all credited at most {drained_in:.1f} s after the last fault ended")
    caught_up = all(caught_up_in <= args.drain_limit for _, _, caught_up_in in credits_outages)
    ok = (
        result.ok
        and not result.dead_letters
        and caught_up
        and drained_in <= args.drain_limit
        and not restart_problems
        and not silence_problems
    )
    print(f"verdict:           {'OK' if ok else 'FAILED'}   (logs: {workdir / 'logs'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
