"""Node loss on a three-node RabbitMQ cluster with quorum queues: orders flow at a steady rate while the node leading
`credits` is SIGKILLed and later restarted, then another node is stopped gracefully. Afterwards nothing is lost or
credited twice, every amount is right, and every accepted order is credited within a minute of the last fault.
"""

import time

import pytest
from django.conf import settings
from django.db import connections
from kombu import Connection, Exchange, Queue

from accounts.services import api_token_create
from core.contract import CREDITS_QUEUE, QUEUE_TYPE_QUORUM
from credits.models import OrderCredit
from testkit.harness import Cluster
from testkit.load import Ledger, OrderStream
from testkit.processes import free_port, service_env
from testkit.reconcile import wait_for_credits
from testkit.workers import RABBITMQ_CLUSTER_GROUP

# On the three-node cluster's fixed ports: one worker runs every such test. Paired, not in the first pass: with its
# workers loading the cores, the node restarted 5 s before the leader's graceful stop had not rejoined the `credits`
# queue once (before the planned stop waited for a majority), which left it without one past the drain limit; beside
# one other test, every order credited 6.1 s after the last fault.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.paired,
    pytest.mark.django_db(transaction=True),
    pytest.mark.xdist_group(RABBITMQ_CLUSTER_GROUP),
]

RATE = 20  # orders per second, across all clients
DRAIN_LIMIT_SECONDS = 60
CANARY_QUEUE = "canary"
CANARY_MESSAGES = 200
# How long credits are watched for while the killed node is down, until more than a second's orders are credited: a
# bound on the failover (reconnecting to a surviving node, a new leader for `credits`), not a measure of its speed.
# Usually a few seconds; past 20 s once in a suite run on this 2-core machine, with nothing else running.
WHILE_DOWN_SECONDS = 45


def canary_publish(node_url: str) -> None:
    """Publish confirmed messages to a quorum queue led by the given node; return once the last one is confirmed."""
    queue = Queue(
        CANARY_QUEUE, Exchange(CANARY_QUEUE, type="direct"), CANARY_QUEUE, queue_arguments={"x-queue-type": "quorum"}
    )
    with Connection(node_url, transport_options={"confirm_publish": True}) as conn:
        channel = conn.default_channel
        queue(channel).declare()
        channel.queue_purge(CANARY_QUEUE)
        producer = conn.Producer(channel)
        for number in range(CANARY_MESSAGES):
            # With confirm_publish, publish returns only after the broker's basic.ack: the leader has the message
            # on a majority of the queue's members (Raft commit), not only in its own memory.
            producer.publish({"n": number}, exchange=queue.exchange, routing_key=CANARY_QUEUE, delivery_mode=2)


def credits_awarded(user_ids: list[int]) -> int:
    connections["credits"].close()  # a fresh snapshot each time
    return OrderCredit.objects.filter(user_id__in=user_ids).count()


def canary_count(broker_url: str) -> int:
    with Connection(broker_url) as conn:
        return conn.default_channel.queue_declare(CANARY_QUEUE, passive=True).message_count


@pytest.fixture
def services(rabbitmq_cluster, transactional_db, tmp_path):
    """The service's processes with quorum queues on the cluster, which is whole again afterwards."""
    rabbitmq_cluster.ensure_running()
    rabbitmq_cluster.queues_recreate(max_retries=settings.CREDITS_MAX_RETRIES)
    services = Cluster(
        service_env=service_env(CELERY_BROKER_URL=rabbitmq_cluster.broker_url, CELERY_QUEUE_TYPE=QUEUE_TYPE_QUORUM),
        workdir=tmp_path,
        port=free_port(),
    )
    try:
        yield services
    finally:
        services.stop()
        rabbitmq_cluster.ensure_running()
        with Connection(rabbitmq_cluster.broker_url) as conn:
            conn.default_channel.queue_delete(CANARY_QUEUE)


def test_nothing_lost_or_doubled_when_broker_nodes_fail(rabbitmq_cluster, services, make_user, summary):
    users = [make_user(f"nodeloss{i}") for i in range(4)]
    user_ids = [u.pk for u in users]
    tokens = [api_token_create(user=u)[1] for u in users]
    services.start()
    ledger = Ledger()
    stream = OrderStream(services.base_url, tokens, rate=RATE, ledger=ledger)
    faults: list[str] = []
    stream.start()
    try:
        time.sleep(5)
        killed = rabbitmq_cluster.leader(CREDITS_QUEUE)
        canary_publish(rabbitmq_cluster.node_url(killed))
        assert rabbitmq_cluster.leader(CANARY_QUEUE) == killed
        rabbitmq_cluster.kill_node(killed)
        faults.append(f"SIGKILL cs{killed} (leading {CREDITS_QUEUE} and {CANARY_QUEUE})")
        time.sleep(2)
        # Every process was connected to cs1, the first URL; credits keep coming only if they all failed over. The
        # relay and the workers reconnect at once, but the broker nacks what is published to `credits` until the
        # surviving members have elected a new leader: usually a second or two, up to about 10 s on a loaded 2-core
        # machine, more while the workers' consumers restart. Watched for up to WHILE_DOWN_SECONDS while cs1 stays down.
        awarded_early, watched = credits_awarded(user_ids), time.monotonic()
        awarded_while_down = 0
        while awarded_while_down <= RATE and time.monotonic() - watched < WHILE_DOWN_SECONDS:
            time.sleep(1)
            awarded_while_down = credits_awarded(user_ids) - awarded_early
        down_for = time.monotonic() - watched
        rabbitmq_cluster.start_node(killed)
        faults.append(f"restart cs{killed}")
        time.sleep(5)
        leader = rabbitmq_cluster.leader(CREDITS_QUEUE)
        stopped = leader if leader != killed else next(n for n in (1, 2, 3) if n != killed)
        # A planned stop, as an operator makes one: once the restarted node is back in every queue, so the stop leaves
        # each a majority (without it, a loaded machine once stopped the leader before cs1 had rejoined `credits`).
        awaited = time.monotonic()
        rabbitmq_cluster.await_quorum(stopped)
        faults.append(f"cs{stopped} not quorum-critical after {time.monotonic() - awaited:.1f} s")
        rabbitmq_cluster.stop_node(stopped)
        last_fault = time.monotonic()
        faults.append(f"graceful stop of cs{stopped} ({CREDITS_QUEUE} leader: cs{leader})")
        time.sleep(5)
    finally:
        stream.stop()

    result, _ = wait_for_credits(
        ledger, user_ids, timeout=max(0.0, last_fault + DRAIN_LIMIT_SECONDS - time.monotonic())
    )
    credited_after = time.monotonic() - last_fault
    time.sleep(2)  # a late duplicate would land now
    result, _ = wait_for_credits(ledger, user_ids, timeout=5)
    canaries = canary_count(rabbitmq_cluster.broker_url)
    summary(
        f"\nfaults: {faults}\nclient statuses: {dict(ledger.statuses)}\nrestarted by the supervisor: "
        f"{dict(services.restarts)}\n{result}\nevery order credited {credited_after:.1f}s after the last fault"
        f"\ncanary messages confirmed before the kill and still there: {canaries}/{CANARY_MESSAGES}"
        f"\ncredits awarded while cs{killed} was down: {awarded_while_down} in the {down_for:.0f} s watched"
    )

    assert canaries == CANARY_MESSAGES
    assert awarded_while_down > RATE, "the relay and the workers did not fail over to a surviving node"
    assert ledger.attempted > 100
    result.assert_nothing_lost_or_duplicated(logs=services.logs("credits") + services.logs("relay"))
    assert credited_after <= DRAIN_LIMIT_SECONDS
