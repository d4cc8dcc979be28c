"""Rolling out message version 2 while orders flow, with real processes, in the order docs/OPERATIONS.md gives.

A consumer still on the release before (CREDITS_ACCEPTED_MESSAGE_VERSIONS=1) runs beside an upgraded one (1,2); the
producer switches to version 2 mid-stream (a second gunicorn with ORDER_MESSAGE_VERSION=2 takes the traffic, as a
rolling web deploy does). Every order is credited once and nothing is dead-lettered: the old consumer hands version-2
messages back for the new one. Then the upgraded consumer stops: version-2 messages wait, no dead letter and no retry
spent, and are credited once it is back.
"""

import re
import signal
import time

import pytest
import requests
from django.db import connections

from accounts.services import api_token_create
from core.contract import CREDITS_DEAD_QUEUE
from credits.tests.support import queue_depth
from testkit.harness import Cluster, Ledger, OrderStream, wait_for_credits, wait_until_credited
from testkit.processes import free_port
from testkit.waiting import wait_for

pytestmark = pytest.mark.slow

RATE = 20  # orders per second, across all clients
PHASE_SECONDS = 6
CATCH_UP_LIMIT_SECONDS = 90
HANDBACK = "handed back for a newer consumer"
RETRY_SPENT = re.compile(r"failed \(\w+\), retry")


class RolloutCluster(Cluster):
    """The usual processes, plus a credits worker of the release before and a web already writing version 2."""

    web_v2_port: int = 0

    def commands(self) -> dict[str, list[str]]:
        commands = super().commands()
        commands["credits-v1"] = [
            arg.replace("credits@", "credits-v1@") for arg in commands["credits"]
        ]  # same queue, another node name
        commands["web-v2"] = [
            arg if not arg.startswith("--bind=") else f"--bind=127.0.0.1:{self.web_v2_port}" for arg in commands["web"]
        ]
        return commands


def orders_acknowledged(ledger: Ledger) -> set[int]:
    with ledger.lock:
        return {order_id for order_id, _ in ledger.acknowledged.values()}


def credited(order_ids: set[int]) -> set[int]:
    connection = connections["credits"]
    connection.close()
    placeholders = ",".join(["%s"] * len(order_ids)) or "NULL"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT order_id FROM order_credits WHERE order_id IN ({placeholders})", list(order_ids))
        return {row[0] for row in cursor.fetchall()}


def dead_letters() -> int:
    connection = connections["credits"]
    connection.close()
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM credit_dead_letters")
        return cursor.fetchone()[0]


def versions_and_dates(user_ids: list[int]) -> list[tuple[int, int, object, object]]:
    """Return (order id, message version, order created_at, credit ordered_at) for each order of these users."""
    placeholders = ",".join(["%s"] * len(user_ids))
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT o.id, JSON_VALUE(t.payload, '$.schema_version'), o.created_at FROM orders o"
            f" JOIN transaction_log t ON t.id = o.transaction_id WHERE o.user_id IN ({placeholders})",
            user_ids,
        )
        orders = {order_id: (int(version), created_at) for order_id, version, created_at in cursor.fetchall()}
    with connections["credits"].cursor() as cursor:
        cursor.execute(f"SELECT order_id, ordered_at FROM order_credits WHERE user_id IN ({placeholders})", user_ids)
        ordered_at = dict(cursor.fetchall())
    return [(oid, version, created_at, ordered_at.get(oid)) for oid, (version, created_at) in sorted(orders.items())]


def wait_healthy(base_url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{base_url}/healthz", timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{base_url} did not answer within {timeout:.0f}s")


@pytest.fixture
def rollout(cluster):
    """The cluster fixture's set-up, with the two extra processes and fast hand-backs (backoff 0.2 s up to 2 s)."""
    rollout = RolloutCluster(
        service_env=cluster.service_env,
        workdir=cluster.workdir,
        port=cluster.port,
        extra_env={"CREDITS_RETRY_BASE_SECONDS": "0.2", "CREDITS_RETRY_MAX_SECONDS": "2"},
        process_env={
            **cluster.process_env,
            "credits-v1": {**cluster.process_env["credits"], "CREDITS_ACCEPTED_MESSAGE_VERSIONS": "1"},
            "web-v2": {**cluster.process_env.get("web", {}), "ORDER_MESSAGE_VERSION": "2"},
        },
    )
    rollout.web_v2_port = free_port()
    try:
        yield rollout
    finally:
        rollout.stop()


def test_version_2_rolls_out_while_orders_flow_and_waits_for_a_consumer_that_knows_it(rollout, make_user, capsys):
    users = [make_user(f"rollout{i}") for i in range(4)]
    user_ids = [u.pk for u in users]
    tokens = [api_token_create(user=u)[1] for u in users]
    rollout.start("web", "relay", "outbox", "beat", "credits", "credits-v1")
    ledger = Ledger()
    old_web = OrderStream(rollout.base_url, tokens, rate=RATE, ledger=ledger, seed=1)
    old_web.start()
    time.sleep(PHASE_SECONDS)

    # The web deploy: the new release (writing version 2) takes over the traffic.
    rollout.start("web-v2")
    web_v2_url = f"http://127.0.0.1:{rollout.web_v2_port}"
    wait_healthy(web_v2_url)
    new_web = OrderStream(web_v2_url, tokens, rate=RATE, ledger=ledger, seed=2)
    new_web.start()
    old_web.stop()
    time.sleep(PHASE_SECONDS)
    mixed = orders_acknowledged(ledger)
    mixed_caught_up_in = wait_until_credited(mixed, timeout=CATCH_UP_LIMIT_SECONDS)
    handbacks_mixed = rollout.logs("credits-v1", tail=100_000).count(HANDBACK)
    dead_mixed = dead_letters()

    # The upgraded consumer stops; only the one of the release before is left.
    rollout.kill("credits", signal.SIGTERM)
    before_stop = orders_acknowledged(ledger)
    time.sleep(PHASE_SECONDS)
    waiting = orders_acknowledged(ledger) - before_stop

    def handbacks_away() -> int:
        return rollout.logs("credits-v1", tail=100_000).count(HANDBACK) - handbacks_mixed

    # Each waiting message met the old consumer at least once, and came back to the queue.
    wait_for(lambda: handbacks_away() >= len(waiting), what=f"{len(waiting)} hand-backs by the version-1 consumer")
    credited_while_away = credited(waiting)
    dead_while_away = dead_letters()
    handed_back_away = handbacks_away()

    # It comes back.
    rollout.start("credits")
    back_caught_up_in = wait_until_credited(waiting, timeout=CATCH_UP_LIMIT_SECONDS)
    new_web.stop()
    result, _ = wait_for_credits(ledger, user_ids, timeout=CATCH_UP_LIMIT_SECONDS)
    rows = versions_and_dates(user_ids)
    logs = {name: rollout.logs(name, tail=1_000_000) for name in ("credits", "credits-v1")}
    retries_spent = sum(len(RETRY_SPENT.findall(text)) for text in logs.values())
    with capsys.disabled():
        print(
            f"\nversion 1 orders: {sum(1 for r in rows if r[1] == 1)}, version 2: {sum(1 for r in rows if r[1] == 2)}"
            f"\nmixed consumers: {len(mixed)} orders credited {mixed_caught_up_in:.1f} s after the phase,"
            f" {handbacks_mixed} hand-backs by the version-1 consumer, {dead_mixed} dead letters"
            f"\nupgraded consumer away: {len(waiting)} version-2 orders waited ({len(credited_while_away)} credited,"
            f" {dead_while_away} dead letters, {handed_back_away} hand-backs); all credited {back_caught_up_in:.1f} s"
            f" after it returned\n{result}\nclient statuses: {dict(ledger.statuses)}; retries spent: {retries_spent};"
            f" restarted by the supervisor: {dict(rollout.restarts)}"
        )

    # Both versions flowed, and the old consumer really met version 2 and handed it back.
    assert {r[1] for r in rows} == {1, 2}
    assert handbacks_mixed > 0
    assert dead_mixed == 0
    assert mixed_caught_up_in <= CATCH_UP_LIMIT_SECONDS
    # Without a consumer that knows version 2, its messages waited: none credited, none dead-lettered.
    assert waiting, "orders were placed while the upgraded consumer was away"
    assert credited_while_away == set()
    assert dead_while_away == 0
    # Back again: every order credited once, no dead letter, no retry spent on any of it.
    assert back_caught_up_in <= CATCH_UP_LIMIT_SECONDS
    result.assert_nothing_lost_or_duplicated(logs=logs["credits"][-5000:])
    assert result.dead_letters == 0
    assert queue_depth(CREDITS_DEAD_QUEUE) == 0
    assert retries_spent == 0
    # A version-2 credit is dated by its order; a version-1 credit does not know the date.
    assert [(oid, ordered_at) for oid, version, created_at, ordered_at in rows if version == 1 and ordered_at] == []
    assert [oid for oid, version, created_at, ordered_at in rows if version == 2 and ordered_at != created_at] == []
