"""CELERY_QUEUE_TYPE=quorum on the three-node cluster: retries held by the broker, a retry limit the broker agrees
with, and dead letters that reach credits.dead with their DeadLetter row. Real workers, real cluster, real MariaDB.
"""

import json
import time

import pytest
from kombu import Connection
from kombu.transport.native_delayed_delivery import level_name

from config.celery import task_queues
from core.contract import (
    ANALYTICS_QUEUE,
    CREDITS_DEAD_QUEUE,
    CREDITS_EXPIRED_QUEUE,
    CREDITS_QUEUE,
    OUTBOX_QUEUE,
    QUEUE_TYPE_QUORUM,
)
from credits.models import DeadLetter, OrderCredit
from credits.tests.support import DatabaseFaults, Worker, place_order
from outbox.claims import ClaimedMessage
from outbox.publisher import Publisher
from testkit.broker_proxy import BrokerProxy
from testkit.processes import database_address, database_url, free_port
from testkit.waiting import wait_for
from testkit.workers import RABBITMQ_CLUSTER_GROUP

# On the three-node cluster's fixed ports: one worker runs every such test.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.xdist_group(RABBITMQ_CLUSTER_GROUP),
]

MAX_RETRIES = 2
V2_QUEUE = "credits.v2"


def credits_queue(name: str = CREDITS_QUEUE):
    return next(q for q in task_queues(queue_type=QUEUE_TYPE_QUORUM, max_retries=MAX_RETRIES) if q.name == name)


def publish(broker_url: str, payload: dict, *, queue: str = CREDITS_QUEUE) -> None:
    """Publish one credits message to this queue the way the relay does, and require the broker's confirm."""
    publisher = Publisher(url=broker_url, queue=credits_queue(queue))
    try:
        result = publisher.publish([ClaimedMessage(id=payload["transaction_id"], payload=payload, attempts=0)])
    finally:
        publisher.close()
    assert result.confirmed == [payload["transaction_id"]], result.failed


def dead_messages(broker_url: str) -> list[tuple[dict, dict]]:
    """Remove and return every (headers, kwargs) in credits.dead."""
    taken = []
    with Connection(broker_url) as conn:
        channel = conn.default_channel
        while (message := channel.basic_get(CREDITS_DEAD_QUEUE, no_ack=True)) is not None:
            _args, kwargs, _embed = json.loads(message.body)
            taken.append((message.headers, kwargs))
    return taken


def delayed_messages(broker_url: str) -> int:
    """Return how many messages wait in native delayed delivery's queues (passive declares: faster than rabbitmqctl)."""
    with Connection(broker_url) as conn:
        channel = conn.default_channel
        return sum(channel.queue_declare(level_name(level), passive=True).message_count for level in range(28))


@pytest.fixture
def quorum(rabbitmq_cluster, transactional_db, tmp_path):
    """The cluster with freshly declared quorum queues, a way to start credits workers on it, and database faults."""
    rabbitmq_cluster.ensure_running()
    rabbitmq_cluster.queues_recreate(max_retries=MAX_RETRIES)
    faults = DatabaseFaults()
    faults.install()
    workers: list[Worker] = []

    def start_worker(**env: str) -> Worker:
        env = {
            "CELERY_BROKER_URL": rabbitmq_cluster.broker_url,
            "CELERY_QUEUE_TYPE": QUEUE_TYPE_QUORUM,
            "CREDITS_MAX_RETRIES": str(MAX_RETRIES),
            "CREDITS_RETRY_BASE_SECONDS": "1",
            **env,
        }
        worker = Worker(f"quorum-{len(workers)}", tmp_path, concurrency=2, env=env)
        workers.append(worker)
        return worker.start(timeout=120)

    yield rabbitmq_cluster, start_worker, faults
    for worker in workers:
        worker.stop()
    faults.remove()


def test_the_queues_are_quorum_queues_replicated_on_every_node(quorum):
    cluster, start_worker, _faults = quorum
    start_worker()  # declares its queues again: the same arguments, or it would not start
    types = cluster.queue_types()
    names = (OUTBOX_QUEUE, CREDITS_QUEUE, V2_QUEUE, CREDITS_EXPIRED_QUEUE, CREDITS_DEAD_QUEUE)
    assert {types[name] for name in names} == {"quorum"}
    # Native delayed delivery's levels, declared by the worker, are quorum queues too.
    assert types["celery_delayed_0"] == types["celery_delayed_27"] == "quorum"
    members = cluster.ctl(1, "-q", "list_queues", "name", "members", "--no-table-headers")
    credits_line = next(line for line in members.splitlines() if line.split()[0] == CREDITS_QUEUE)
    assert all(f"cs{n}@localhost" in credits_line for n in (1, 2, 3))


def test_a_planned_stop_waits_while_a_node_is_down_and_goes_ahead_once_it_is_back(quorum):
    """What the node-loss test and a rolling restart wait on before stopping a node (scripts/rabbitmq_cluster.sh
    await-quorum): with one of three members down, stopping a second would leave every queue without a majority."""
    cluster = quorum[0]
    cluster.stop_node(3)
    try:
        refused = time.monotonic()
        with pytest.raises(RuntimeError, match="await-quorum 2 5 failed"):
            cluster.await_quorum(2, seconds=5)
        assert time.monotonic() - refused >= 5
    finally:
        cluster.start_node(3)
    cluster.await_quorum(2, seconds=60)


def test_a_credits_worker_starts_where_the_other_queues_were_never_declared(quorum, user):
    """A `-Q credits` worker binds only what it consumes to the delayed-delivery exchanges: on a new vhost it once
    failed to start, binding `analytics`, whose exchange no one had declared (bench_credits on a fresh cluster)."""
    cluster, start_worker, _faults = quorum
    with Connection(cluster.broker_url) as connection:
        channel = connection.default_channel
        channel.queue_delete(ANALYTICS_QUEUE)
        channel.exchange_delete(ANALYTICS_QUEUE)
    start_worker()
    order_id, payload = place_order(user=user, total=4)
    publish(cluster.broker_url, payload)
    wait_for(lambda: OrderCredit.objects.filter(order_id=order_id).exists(), timeout=30, what="the award")


def test_a_retry_waits_in_the_broker_not_in_the_worker(quorum, user):
    cluster, start_worker, faults = quorum
    worker = start_worker(CREDITS_RETRY_BASE_SECONDS="16")  # the first retry waits 8 to 16 s
    order_id, payload = place_order(user=user, total=5)
    faults.set(order_id, refuse=1)
    publish(cluster.broker_url, payload)
    wait_for(lambda: worker.count(r"retry 1 in") == 1, timeout=30, what="the first attempt to fail")
    # The retry sits in a celery_delayed_* queue: the broker holds it, not the worker (an ETA task on classic queues).
    assert delayed_messages(cluster.broker_url) == 1
    wait_for(lambda: OrderCredit.objects.filter(order_id=order_id).exists(), timeout=30, what="the award")
    assert OrderCredit.objects.get(order_id=order_id).amount == 10
    assert not DeadLetter.objects.exists()


def test_a_message_failing_every_time_ends_in_credits_dead_with_its_dead_letter_row(quorum, user):
    cluster, start_worker, faults = quorum
    start_worker()
    order_id, payload = place_order(user=user, total=2)
    faults.set(order_id, refuse=100)
    publish(cluster.broker_url, payload)
    dead = wait_for(lambda: DeadLetter.objects.first(), timeout=60, what="the dead letter row")
    assert dead.attempts == MAX_RETRIES + 1
    assert dead.reason == DeadLetter.Reason.DEADLOCK
    messages = wait_for(lambda: dead_messages(cluster.broker_url), timeout=10, what="the message in credits.dead")
    assert [kwargs["message"]["order_id"] for _headers, kwargs in messages] == [order_id]
    assert not OrderCredit.objects.filter(order_id=order_id).exists()


def requeue(broker_url: str, times: int) -> None:
    """Take the credits message and hand it back unacknowledged, as a worker dying with it in hand would."""
    with Connection(broker_url) as conn:
        channel = conn.default_channel
        for _ in range(times):
            message = wait_for(lambda: channel.basic_get(CREDITS_QUEUE), timeout=10, what="the credits message")
            channel.basic_reject(message.delivery_tag, requeue=True)


def test_a_message_redelivered_past_the_retry_limit_is_dead_lettered_with_its_row_untried(quorum, user):
    cluster, start_worker, _faults = quorum
    order_id, payload = place_order(user=user, total=2)
    publish(cluster.broker_url, payload)
    requeue(cluster.broker_url, MAX_RETRIES + 1)
    start_worker()
    dead = wait_for(lambda: DeadLetter.objects.first(), timeout=60, what="the dead letter row")
    assert dead.reason == DeadLetter.Reason.UNEXPECTED
    assert f"delivered {MAX_RETRIES + 2} times" in dead.error
    messages = wait_for(lambda: dead_messages(cluster.broker_url), timeout=10, what="the message in credits.dead")
    assert [kwargs["message"]["order_id"] for _headers, kwargs in messages] == [order_id]
    assert not OrderCredit.objects.filter(order_id=order_id).exists()


def test_the_broker_dead_letters_a_message_redelivered_once_more_and_drops_nothing(quorum, user):
    cluster, _start_worker, _faults = quorum
    order_id, payload = place_order(user=user, total=2)
    publish(cluster.broker_url, payload)
    requeue(cluster.broker_url, MAX_RETRIES + 2)
    messages = wait_for(lambda: dead_messages(cluster.broker_url), timeout=10, what="the message in credits.dead")
    [(headers, kwargs)] = messages
    assert headers["x-first-death-reason"] == "delivery_limit"
    assert kwargs["message"]["order_id"] == order_id


def test_a_credits_database_outage_spends_no_delivery_and_makes_no_dead_letter(quorum, user):
    """A requeue counts toward a quorum queue's delivery limit, so during an outage the message is republished."""
    rabbit, start_worker, _faults = quorum
    proxy = BrokerProxy(free_port(), upstream=database_address("credits"))
    proxy.up()
    through_proxy = database_url("credits", port=proxy.port)
    try:
        worker = start_worker(CREDITS_DATABASE_URL=through_proxy, CREDITS_OUTAGE_WAIT_SECONDS="0.5")
        proxy.down()
        order_id, payload = place_order(user=user, total=5)
        publish(rabbit.broker_url, payload)
        # More times back on the queue than the delivery limit (MAX_RETRIES + 1) would allow deliveries.
        wait_for(lambda: worker.count("put back on the queue") > MAX_RETRIES + 2, timeout=90, what="outage republishes")
        proxy.up()
        wait_for(lambda: OrderCredit.objects.filter(order_id=order_id).exists(), timeout=60, what="the credit")
    finally:
        proxy.down()
    assert OrderCredit.objects.get(order_id=order_id).amount == 10
    assert not DeadLetter.objects.exists()
    assert dead_messages(rabbit.broker_url) == []
    assert worker.count(r"retry: Retry in") == worker.count("put back on the queue"), "republished, not retried"


def test_a_newer_version_waits_in_its_queue_for_a_consumer_that_knows_it(quorum, user, settings):
    """Rolling upgrade on quorum queues: a version-1 consumer never receives the version-2 message, which waits in
    credits.v2 until a consumer accepting version 2 starts and awards it once; its retries are delayed through
    credits.v2 too (native delayed delivery)."""
    cluster, start_worker, faults = quorum
    settings.ORDER_MESSAGE_VERSION = 2
    old = start_worker(CREDITS_ACCEPTED_MESSAGE_VERSIONS="1")
    order_id, payload = place_order(user=user, total=5)
    faults.set(order_id, refuse=1)
    publish(cluster.broker_url, payload, queue=V2_QUEUE)
    time.sleep(3)
    with Connection(cluster.broker_url) as conn:  # a passive declare: rabbitmqctl's counts lag by seconds
        assert conn.default_channel.queue_declare(V2_QUEUE, passive=True).message_count == 1
    assert old.count(r"award_credits\[\w+\] received") == 0
    new = start_worker(CREDITS_ACCEPTED_MESSAGE_VERSIONS="1,2")
    wait_for(lambda: OrderCredit.objects.filter(order_id=order_id).exists(), timeout=60, what="the award")
    assert OrderCredit.objects.get(order_id=order_id).ordered_at is not None
    assert new.count(r"retry 1 in") == 1, "the retry went through credits.v2 to the consumer that accepts it"
    assert old.count(r"award_credits\[\w+\] received") == 0
    assert not DeadLetter.objects.exists()
    assert dead_messages(cluster.broker_url) == []


def test_a_newer_version_nobody_takes_is_dead_lettered_once_its_time_to_live_runs_out(quorum, user, settings):
    cluster, start_worker, _faults = quorum
    settings.ORDER_MESSAGE_VERSION = 2
    settings.CREDITS_UNKNOWN_VERSION_WAIT_SECONDS = 3  # the relay's time to live for the message
    start_worker(CREDITS_ACCEPTED_MESSAGE_VERSIONS="1")
    order_id, payload = place_order(user=user, total=5)
    publish(cluster.broker_url, payload, queue=V2_QUEUE)
    dead = wait_for(lambda: DeadLetter.objects.first(), timeout=60, what="the dead letter row")
    assert (dead.reason, dead.attempts, dead.order_id) == (DeadLetter.Reason.VERSION_NOT_SUPPORTED, 1, order_id)
    assert "took it from credits.v2" in dead.error
    messages = wait_for(lambda: dead_messages(cluster.broker_url), timeout=10, what="the message in credits.dead")
    assert [(headers["retries"], kwargs["message"]["order_id"]) for headers, kwargs in messages] == [(0, order_id)]
    assert not OrderCredit.objects.exists()
