"""The short fault-injection run: a steady stream of retried orders while workers, relays, the broker and database
connections fail; afterwards nothing is lost, nothing is credited twice, every amount is right, and the nightly
consistency job agrees. `bench/soak.py` runs the same faults for as long as you like.
"""

import json
import subprocess
import sys
import time

import pytest
from django.db import connection
from django.utils import timezone

from accounts.services import api_token_create
from config.celery import app
from core.contract import AWARD_CREDITS_TASK, CREDITS_QUEUE
from credits.models import OrderCredit
from orders.models import Order
from testkit.db_faults import kill_database_connections
from testkit.harness import ROOT
from testkit.load import Ledger, OrderStream
from testkit.queues import purge_queues
from testkit.rabbitmq_cluster import private_broker
from testkit.reconcile import wait_for_credits, wait_until_published
from testkit.waiting import wait_for

# Paired: the drain limit is measured beside one other test. The broker it stops is its own (`broker`).
pytestmark = [pytest.mark.slow, pytest.mark.paired]

RATE = 20  # orders per second, across all clients
DRAIN_LIMIT_SECONDS = 60
# The relay's lease on the rows it claimed (OUTBOX_LEASE_SECONDS, 60 s in production), shortened in the cluster: the
# rows a killed relay published but never marked are published again once it lapses, within the run, not a minute on.
LEASE_SECONDS = 10


def credit_messages(order_ids: list[int]) -> list:
    """Return the outbox rows of these orders' credit messages."""
    from outbox.models import TransactionLog

    return list(TransactionLog.objects.filter(business="order", foreign_key__in=[str(i) for i in order_ids]))


@pytest.fixture
def broker(tmp_path_factory):
    """A broker of one node for this test alone: stopping it disturbs no other test worker."""
    node = private_broker(tmp_path_factory.mktemp("broker"))
    try:
        node.start()
        purge_queues(node.broker_url)
        yield node
    finally:
        node.stop()


def redeliver(broker_url: str, rows: list) -> None:
    """Publish credit messages of already-credited orders a second time (a duplicate delivery), by their task id."""
    with app.connection_for_write(broker_url) as conn:
        for row in rows:
            app.send_task(
                AWARD_CREDITS_TASK,
                kwargs={"message": row.payload},
                task_id=row.id,
                queue=CREDITS_QUEUE,
                connection=conn,
            )


def awards_finished(cluster, task_ids: list[str]) -> list[int]:
    """Return how many times the credits worker logged each of these awards done ('awarded' or 'duplicate')."""
    log = cluster.logs("credits", tail=1_000_000)
    return [log.count(f"Task {AWARD_CREDITS_TASK}[{task_id}] succeeded") for task_id in task_ids]


def run_nightly(cluster, day: str) -> dict:
    env = {**cluster.env(), "CONSISTENCY_GRACE_SECONDS": "0"}
    result = subprocess.run(
        [sys.executable, "manage.py", "run_nightly_reports", "--date", day],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return json.loads((cluster.workdir / "reports" / day / "consistency.json").read_text())


def test_nothing_lost_or_doubled_under_faults(broker, cluster, make_user, summary):
    users = [make_user(f"reliability{i}") for i in range(4)]
    user_ids = [u.pk for u in users]
    tokens = [api_token_create(user=u)[1] for u in users]
    cluster.extra_env["CELERY_BROKER_URL"] = broker.broker_url
    cluster.extra_env["OUTBOX_LEASE_SECONDS"] = str(LEASE_SECONDS)
    cluster.start()
    wait_for(lambda: broker.queue_consumers()[CREDITS_QUEUE] > 0, what="the credits worker on the test's own broker")
    ledger = Ledger()
    stream = OrderStream(cluster.base_url, tokens, rate=RATE, ledger=ledger)
    faults: list[str] = []
    broker_down: tuple[float, float] | None = None
    stream.start()
    try:
        # Each fault meets orders in flight: at RATE orders/s, two seconds between faults put dozens through every
        # process that is killed or cut. The broker stays down 6 s with its listener closed: every connect is
        # refused at once, and a worker's retries, 1, 2 and 3 s apart (core/worker.py), fail until it is back.
        time.sleep(2)
        faults.append(f"SIGKILL credits pool processes: {cluster.kill_pool_children('credits')}")
        time.sleep(2)
        cluster.kill("relay")
        faults.append("SIGKILL relay_outbox")
        time.sleep(1)
        cluster.start("relay")
        time.sleep(2)
        down_at = time.monotonic()
        broker.ctl(1, "stop_app")
        faults.append("rabbitmqctl stop_app")
        time.sleep(6)
        broker.ctl(1, "start_app")
        broker_down = (down_at, time.monotonic())
        faults.append("rabbitmqctl start_app")
        time.sleep(2)
        faults.append(f"KILL database connections: {kill_database_connections(connection.settings_dict['NAME'])}")
        time.sleep(2)
        faults.append(f"SIGKILL credits pool processes: {cluster.kill_pool_children('credits')}")
        time.sleep(2)
    finally:
        stream.stop()
    placed = list(Order.objects.filter(user_id__in=user_ids).values_list("id", flat=True))
    credited = list(OrderCredit.objects.filter(order_id__in=placed).values_list("order_id", flat=True)[:20])
    messages = credit_messages(credited)
    duplicates = [row.id for row in messages]
    originals = awards_finished(cluster, duplicates)
    redeliver(broker.broker_url, messages)
    faults.append(f"duplicate deliveries: {len(duplicates)}")

    result, drained_in = wait_for_credits(ledger, user_ids, timeout=DRAIN_LIMIT_SECONDS)
    # The final count proves nothing doubled only once the duplicates were consumed.
    wait_for(
        lambda: all(now > before for now, before in zip(awards_finished(cluster, duplicates), originals, strict=True)),
        what="the duplicate deliveries to be consumed",
    )
    result, _ = wait_for_credits(ledger, user_ids, timeout=5)
    summary(
        f"\nfaults: {faults}\nclient statuses: {dict(ledger.statuses)}\nrestarted by the supervisor: "
        f"{dict(cluster.restarts)}\n{result}\ndrained in {drained_in:.1f}s"
    )

    assert ledger.attempted > 100
    result.assert_nothing_lost_or_duplicated(logs=cluster.logs("credits") + cluster.logs("relay"))
    assert drained_in <= DRAIN_LIMIT_SECONDS
    start, end = broker_down
    assert [s for t, s in ledger.server_errors if start <= t <= end + 1] == [], "5xx while only the broker was down"

    # A relay killed after a publish and before its mark leaves those rows leased: published again once it lapses.
    assert wait_until_published(timeout=LEASE_SECONDS + 30) == 0, "outbox rows never published"
    report = run_nightly(cluster, timezone.now().date().isoformat())
    assert report["ok"] is True, json.dumps(report["checks"], indent=1)
