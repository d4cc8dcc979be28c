"""Rolling out routing by version and message version 2 while orders flow, with real processes of both releases, in
the order docs/OPERATIONS.md ("Deploying a new version") gives; on classic queues and on quorum queues.

The release before routing (a git worktree of it, testkit/releases.py) runs the relay, the outbox worker and a
consumer accepting versions 1 and 2; version-1 and version-2 orders flow the whole time (two gunicorns, one with
ORDER_MESSAGE_VERSION=2). Its relay publishes both versions to `credits`. Then, as the runbook says:
1. this release's consumer starts and the old one stops: it takes `credits` (both versions) and `credits.v2`;
2. this release's relay and outbox worker start and the old ones stop: version 2 now goes to `credits.v2`;
3. a consumer of the release before accepting only version 1 starts, and the consumer accepting version 2 goes away
   for AWAY_SECONDS, several seconds past the "at once" bound: version-1 orders are credited within AT_ONCE_SECONDS,
   while version-2 orders of the same age wait in `credits.v2`, none credited or dead-lettered; the old consumer
   receives no version-2 message, so it hands nothing back;
4. a consumer accepting version 2 starts: the waiting orders are credited within seconds.
Every order is credited exactly once, with no dead letter and no retry spent.
"""

import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.conf import settings
from django.db import connections
from kombu import Connection

from accounts.services import api_token_create
from core.contract import CREDITS_DEAD_QUEUE, QUEUE_TYPE_QUORUM
from testkit.harness import Cluster
from testkit.load import Ledger, OrderStream
from testkit.processes import free_port
from testkit.reconcile import wait_for_credits, wait_until_credited
from testkit.releases import BEFORE_VERSION_ROUTING, release_checkout
from testkit.workers import RABBITMQ_CLUSTER_GROUP

# The module runs paired (beside one other test at most) for its timing bounds: "at once" (AT_ONCE_SECONDS) keeps a
# wide margin under load, its slowest credit well under a second, but the consumer's return (BACK_LIMIT_SECONDS)
# counts a Celery worker's start, which takes 10 s and more on two cores at the first pass's load of 20, and 2.0-2.2 s
# beside one other test. Only the quorum variant is on the three-node cluster's fixed ports (the worker that runs
# every such test); the classic one runs on its worker's own vhost, so either worker may take it.
pytestmark = [pytest.mark.slow, pytest.mark.paired]

# Orders per second, per message version: each phase sees a few of each version, all that its steps need.
RATE = 2
# How long each step's processes run with orders flowing before the next step: 4 orders of each version, besides
# those placed while processes start and stop.
PHASE_SECONDS = 2
# "At once": a version-1 order placed while the version-2 consumer is away is credited within this.
AT_ONCE_SECONDS = 5
# The deadline the away phase crosses: the orders of its first AWAY_SECONDS - AT_ONCE_SECONDS are past AT_ONCE_SECONDS
# when judged, so a version-2 one not credited waits where a version-1 one of its age is credited.
AWAY_SECONDS = AT_ONCE_SECONDS + 5
BACK_LIMIT_SECONDS = 10
CATCH_UP_LIMIT_SECONDS = 90
HANDBACK = "handed back for a newer consumer"  # what a consumer of the release before logs for each hand-back
RETRY_SPENT = re.compile(r"failed \(\w+\), retry")
OLD = ("old-relay", "old-outbox", "old-credits", "older-credits")


class RolloutCluster(Cluster):
    """The usual processes, a web already writing version 2, and processes of the release before routing."""

    web_v2_port: int = 0

    def commands(self) -> dict[str, list[str]]:
        commands = super().commands()

        def renamed(base: str, name: str) -> list[str]:
            return [arg.replace(f"{base}@", f"{name}@") for arg in commands[base]]

        return {
            **commands,
            "web-v2": [
                arg if not arg.startswith("--bind=") else f"--bind=127.0.0.1:{self.web_v2_port}"
                for arg in commands["web"]
            ],
            "old-relay": commands["relay"],
            "old-outbox": renamed("outbox", "old-outbox"),
            "old-credits": renamed("credits", "old-credits"),
            "older-credits": renamed("credits", "older-credits"),
        }


def credited(order_ids: set[int]) -> set[int]:
    connection = connections["credits"]
    connection.close()
    placeholders = ",".join(["%s"] * len(order_ids)) or "NULL"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT order_id FROM order_credits WHERE order_id IN ({placeholders})", list(order_ids))
        return {row[0] for row in cursor.fetchall()}


def credit_delays(order_ids: set[int]) -> list[float]:
    """Return, for each of these orders credited, the seconds from its order's creation to its credit's."""
    placeholders = ",".join(["%s"] * len(order_ids)) or "NULL"
    with connections["default"].cursor() as cursor:
        cursor.execute(f"SELECT id, created_at FROM orders WHERE id IN ({placeholders})", list(order_ids))
        ordered = dict(cursor.fetchall())
    connections["credits"].close()
    with connections["credits"].cursor() as cursor:
        cursor.execute(
            f"SELECT order_id, created_at FROM order_credits WHERE order_id IN ({placeholders})", list(order_ids)
        )
        return [(at - ordered[oid]).total_seconds() for oid, at in cursor.fetchall()]


def dead_letters() -> int:
    connection = connections["credits"]
    connection.close()
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM credit_dead_letters")
        return cursor.fetchone()[0]


def placed(ledger: Ledger) -> set[int]:
    with ledger.lock:
        return {order_id for order_id, _ in ledger.acknowledged.values()}


def dead_queue_depth(broker_url: str) -> int:
    with Connection(broker_url) as conn:
        return conn.default_channel.queue_declare(CREDITS_DEAD_QUEUE, passive=True).message_count


@pytest.fixture(scope="module")
def release_before():
    with release_checkout(BEFORE_VERSION_ROUTING) as path:
        yield path


@pytest.fixture(params=["classic", pytest.param("quorum", marks=pytest.mark.xdist_group(RABBITMQ_CLUSTER_GROUP))])
def rollout(request, cluster, release_before):
    """The processes of both releases, each with its own database user: on the test broker with classic queues, or on
    the three-node cluster with quorum queues."""
    service, broker_url = cluster.service_env, settings.CELERY_BROKER_URL
    if request.param == QUEUE_TYPE_QUORUM:
        rabbit = request.getfixturevalue("rabbitmq_cluster")
        rabbit.ensure_running()
        rabbit.queues_recreate(max_retries=settings.CREDITS_MAX_RETRIES)
        broker_url = rabbit.broker_url
        service = {**service, "CELERY_BROKER_URL": broker_url, "CELERY_QUEUE_TYPE": QUEUE_TYPE_QUORUM}
    process_env = cluster.process_env
    process_env = {
        **process_env,
        **{old: process_env.get(old.split("-")[1], {}) for old in OLD},
        "older-credits": {**process_env.get("credits", {}), "CREDITS_ACCEPTED_MESSAGE_VERSIONS": "1"},
        "web-v2": {**process_env.get("web", {}), "ORDER_MESSAGE_VERSION": "2"},
    }
    rollout = RolloutCluster(
        service_env=service,
        workdir=cluster.workdir,
        port=cluster.port,
        process_env=process_env,
        process_cwd=dict.fromkeys(OLD, release_before),
    )
    rollout.web_v2_port = free_port()
    rollout.broker_url = broker_url
    try:
        yield rollout
    finally:
        rollout.stop()


def test_routing_by_version_rolls_out_and_a_newer_message_waits_for_a_consumer_that_knows_it(
    rollout, make_user, summary
):
    users = {version: [make_user(f"rollout-v{version}-{i}") for i in range(2)] for version in (1, 2)}
    tokens = {version: [api_token_create(user=u)[1] for u in users[version]] for version in (1, 2)}
    ledgers = {1: Ledger(), 2: Ledger()}
    phases = {}
    background = ThreadPoolExecutor(max_workers=2)

    # The release before: its relay, outbox worker and consumer; both message versions flow into `credits`.
    rollout.start("web", "web-v2", "beat", "old-relay", "old-outbox", "old-credits")
    rollout.wait_ready("old-credits")
    web_v2 = f"http://127.0.0.1:{rollout.web_v2_port}"
    streams = [
        OrderStream(rollout.base_url, tokens[1], rate=RATE, ledger=ledgers[1], seed=1),
        OrderStream(web_v2, tokens[2], rate=RATE, ledger=ledgers[2], seed=2),
    ]
    for stream in streams:
        stream.start()
    time.sleep(PHASE_SECONDS)

    # Step 1: the consumers. This release's starts (it takes `credits` and credits.v2); the old one stops gracefully.
    rollout.start("credits")
    rollout.wait_ready("credits")
    # Each phase is counted from the old processes' stop signal (a stopping Celery worker takes no new message, a
    # stopping relay claims no new row); the next step waits for their exit.
    old_consumer = background.submit(rollout.terminate, "old-credits")
    time.sleep(PHASE_SECONDS)
    phases["old consumer stopped"] = old_consumer.result()

    # Step 2: the relays. From here version 2 goes to credits.v2.
    rollout.start("relay", "outbox")
    rollout.wait_ready("outbox")
    # Both at once, as a host running both is stopped.
    old_relay = background.submit(rollout.terminate, "old-relay")
    old_outbox = background.submit(rollout.terminate, "old-outbox")
    time.sleep(PHASE_SECONDS)
    phases["old relay stopped"], phases["old outbox worker stopped"] = old_relay.result(), old_outbox.result()
    background.shutdown()
    before_away = placed(ledgers[1]) | placed(ledgers[2])
    moved_caught_up_in = wait_until_credited(before_away, timeout=CATCH_UP_LIMIT_SECONDS)
    dead_moved = dead_letters()

    # Step 3: a consumer of the release before accepting only version 1 starts; the one accepting 2 goes away.
    rollout.start("older-credits")
    rollout.wait_ready("older-credits")
    # Counted once the consumer accepting 2 is gone: no order counted as placed while away could reach it.
    phases["consumer accepting 2 stopped"] = rollout.terminate("credits")
    v1_before, v2_before = placed(ledgers[1]), placed(ledgers[2])
    # The orders of the first AWAY_SECONDS - AT_ONCE_SECONDS are AT_ONCE_SECONDS old or older when judged: every
    # version-1 one must be credited by then, so a version-2 one of the same age not credited is waiting.
    time.sleep(AWAY_SECONDS - AT_ONCE_SECONDS)
    v1_away, v2_aged = placed(ledgers[1]) - v1_before, placed(ledgers[2]) - v2_before
    time.sleep(AT_ONCE_SECONDS)
    v2_away = placed(ledgers[2]) - v2_before
    v2_credited_away = credited(v2_away)
    dead_away = dead_letters()
    v1_delays = credit_delays(v1_away)

    # Step 4: a consumer accepting version 2 starts.
    started = time.monotonic()
    rollout.start("credits")
    ready_in = rollout.wait_ready("credits", times=2)
    wait_until_credited(v2_away, timeout=CATCH_UP_LIMIT_SECONDS)
    back_caught_up_in = time.monotonic() - started
    for stream in streams:
        stream.stop()
    results = {
        version: wait_for_credits(ledgers[version], [u.pk for u in users[version]], timeout=90)[0] for version in (1, 2)
    }
    logs = {name: rollout.logs(name, tail=1_000_000) for name in ("credits", "old-credits", "older-credits")}
    handbacks = {name: text.count(HANDBACK) for name, text in logs.items()}
    older_received = len(re.findall(r"award_credits\[\w+\] received", logs["older-credits"]))
    retries_spent = sum(len(RETRY_SPENT.findall(text)) for text in logs.values())
    summary(
        f"\n[{rollout.env().get('CELERY_QUEUE_TYPE', 'classic')}] stops: "
        + ", ".join(f"{k} {v.seconds:.1f}s rc={v.returncode}" for k, v in phases.items())
        + f"\nbefore the away phase: {len(before_away)} orders credited {moved_caught_up_in:.1f} s after it,"
        f" {dead_moved} dead letters"
        f"\naway {AWAY_SECONDS} s: {len(v1_away)} v1 orders of its first {AWAY_SECONDS - AT_ONCE_SECONDS} s"
        f" ({len(v1_delays)} credited, in at most {max(v1_delays, default=0):.2f} s), {len(v2_away)} v2 orders"
        f" ({len(v2_aged)} of its first {AWAY_SECONDS - AT_ONCE_SECONDS} s; {len(v2_credited_away)} credited,"
        f" {dead_away} dead letters)"
        f"\nv2 consumer back: ready in {ready_in:.1f} s, every waiting v2 order credited {back_caught_up_in:.1f} s"
        " after its start"
        f"\nv1 {results[1]}\nv2 {results[2]}\nhand-backs {handbacks}; messages (all version 1) the v1-only"
        f" consumer received: {older_received}; retries spent {retries_spent}; restarts {dict(rollout.restarts)}"
    )

    assert all(stop.returncode == 0 for stop in phases.values()), phases
    assert dead_moved == 0
    # Away: version 2 waited, version 1 went on at once.
    assert v1_away and v2_aged
    assert v2_credited_away == set()
    assert dead_away == 0
    assert len(v1_delays) == len(v1_away)
    assert max(v1_delays) <= AT_ONCE_SECONDS
    # Back: every waiting version-2 order credited within seconds of the consumer's start.
    assert back_caught_up_in <= BACK_LIMIT_SECONDS
    # The consumer accepting only version 1 never received a version-2 message: nothing handed back by anyone.
    assert handbacks == {"credits": 0, "old-credits": 0, "older-credits": 0}
    # Every order credited exactly once; no dead letter, no retry spent.
    for result in results.values():
        result.assert_nothing_lost_or_duplicated(logs=logs["credits"][-5000:])
        assert result.dead_letters == 0
    assert dead_queue_depth(rollout.broker_url) == 0
    assert retries_spent == 0
