"""Two writers on two nodes: what certification does to the service's own transactions.

Through the endpoint every process writes to one node, but during a move of the writes (or with endpoints on several
hosts that briefly disagree, docs/OPERATIONS.md) two nodes can take transactions on the same rows at once. No row lock
spans nodes: the later write set to reach certification is refused, and its client gets a deadlock, 1213, at its
COMMIT (or its transaction is aborted on its own node when the other's rows arrive there first). The tests hold
transactions at their COMMIT with proxies (testkit/lost_answer.py, COMMIT_HELD): a relay's claim while a relay on
another node claims, publishes and marks the same rows; an order and its retry with the same Idempotency-Key through a
second web host on another node, both let go at once; the same award taken by two consumers on two nodes, the same
way. Afterwards each message went out once, each key made one order, each order is credited once.
"""

import functools
import json
import subprocess
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from django.conf import settings
from django.db import OperationalError, connections

from accounts.services import api_token_create
from config.celery import app
from core.contract import CREDITS_QUEUE
from credits.models import CreditBalance, OrderCredit
from credits.services import credit_award, credit_balance_ensure
from credits.tests.support import queue_depth
from outbox.drain import drain
from outbox.ids import new_transaction_id
from outbox.models import TransactionLog
from outbox.publisher import Publisher
from testkit.galera_cluster import GALERA_CLUSTER_GROUP
from testkit.harness import Cluster
from testkit.lost_answer import COMMIT_HELD, LostAnswerProxy
from testkit.processes import free_port, mysql_url, service_env
from testkit.queues import purge_queues
from tests.galera.support import (
    fresh,
    other_node,
    post_order,
    retry_until_answered,
    rows_of,
    rows_on_each_node,
    through,
    until_answered,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.xdist_group(GALERA_CLUSTER_GROUP)]

ER_LOCK_DEADLOCK = 1213
ORDERS = 5
# Two batches let go at once on two nodes nearly always conflict in certification (299 of 300 tries by hand); should
# one be applied before the other runs, the loser meets a duplicate key instead, and the test tries a new key.
TRIES = 5
MANAGE = str(settings.BASE_DIR / "manage.py")


def direct_env(address: tuple[str, int], **extra: str) -> dict[str, str]:
    """The environment of a process whose databases are both at `address` (a node, or a proxy in front of one), not
    behind the endpoint."""
    host, port = address
    urls = {
        variable: mysql_url(host=host, port=port, name=connections[alias].settings_dict["NAME"])
        for alias, variable in (("default", "DATABASE_URL"), ("credits", "CREDITS_DATABASE_URL"))
    }
    return service_env(**urls, DATABASE_WSREP_SYNC_WAIT="1", **extra)


def manage(env: dict[str, str], *args: str) -> str:
    completed = subprocess.run(
        [sys.executable, MANAGE, *args], cwd=settings.BASE_DIR, env=env, capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr[-3000:]
    return completed.stdout


@pytest.fixture
def queues():
    purge_queues()
    yield
    purge_queues()


def test_a_relay_whose_claim_meets_another_nodes_claim_fails_with_a_deadlock_and_every_message_goes_out_once(
    on_galera, proxy, client, queues
):
    user, api = client
    # What earlier tests of the package left unpublished is not this test's: only its own orders are due.
    TransactionLog.objects.exclude(status=TransactionLog.Status.PUBLISHED).delete()
    for _ in range(ORDERS):
        assert post_order(api, uuid.uuid4().hex).status_code == 201
    purge_queues()  # the relay's wake-up tasks, which no worker takes here
    other = direct_env(on_galera.node_address(other_node(on_galera)))
    relayed = []
    # This relay has locked the due rows on the writer and sends its lease and COMMIT; meanwhile a relay on another
    # node, where those locks do not exist, claims the same rows, publishes and marks them.
    proxy.arm(COMMIT_HELD, lambda: relayed.append(manage(other, "relay_outbox", "--once")))
    publisher = Publisher()
    try:
        with through(proxy, "default"), pytest.raises(OperationalError) as refused:
            drain(publisher)
        assert proxy.fired.is_set()
        assert relayed == [f"published {ORDERS}\n"]
        # Nothing was published before the claim failed; claimed again, as the relay's loop does, nothing is due.
        assert refused.value.args[0] == ER_LOCK_DEADLOCK, refused.value
        fresh("default")
        assert drain(publisher) == 0
    finally:
        publisher.close()
    order_ids, logs = rows_of(user)
    assert len(order_ids) == ORDERS and logs == ORDERS
    published = TransactionLog.objects.filter(foreign_key__in=[str(order_id) for order_id in order_ids])
    assert set(published.values_list("status", flat=True)) == {TransactionLog.Status.PUBLISHED}
    assert queue_depth(CREDITS_QUEUE) == ORDERS
    transaction_ids = set()
    with app.connection_for_write() as connection:
        queue = app.amqp.queues[CREDITS_QUEUE].bind(connection.default_channel)
        while (message := queue.get(no_ack=True)) is not None:
            transaction_ids.add(message.headers["id"])  # the task id: the row's transaction id
    assert transaction_ids == set(published.values_list("id", flat=True))


@pytest.fixture
def other_proxy(on_galera):
    """A proxy in front of a node the endpoint does not write to, which can hold a COMMIT."""
    with LostAnswerProxy(on_galera.node_address(other_node(on_galera))) as proxy:
        yield proxy


@pytest.fixture
def second_web(other_proxy, tmp_path):
    """A second web host whose endpoint chose another node than ours (through a proxy in front of that node)."""
    web = Cluster(service_env=direct_env(("127.0.0.1", other_proxy.port)), workdir=tmp_path, port=free_port())
    try:
        web.start("web")
        yield web
    finally:
        web.stop()


def hold_both(*proxies: LostAnswerProxy) -> None:
    """Hold the next COMMIT at each proxy until every one has its own, then let them all go at once."""
    together = threading.Barrier(len(proxies), timeout=30)
    for proxy in proxies:
        proxy.arm(COMMIT_HELD, together.wait)


def was_replayed(response) -> bool:
    return response.headers.get("Idempotent-Replayed") == "true"


def post_to(web: Cluster, token: str, key: str):
    """Place the order through a web host over HTTP."""
    return requests.post(
        f"{web.base_url}/api/orders/",
        json={"goods_name": "in doubt", "total": 3},
        headers={"Authorization": f"Token {token}", "Idempotency-Key": key},
        timeout=60,
    )


def test_one_key_sent_to_two_web_hosts_writing_to_two_nodes_makes_one_order(
    on_galera, proxy, other_proxy, client, second_web
):
    user, api = client
    token = api_token_create(user=user)[1]
    paths = []
    for tried in range(1, TRIES + 1):
        key = uuid.uuid4().hex
        # The client's request and its retry through the other host, each batch (order, message, key, COMMIT) held
        # at its proxy until both are, then both run at once, one on each node.
        hold_both(proxy, other_proxy)
        with ThreadPoolExecutor(max_workers=1) as pool:
            other_host = pool.submit(post_to, second_web, token, key)
            with through(proxy, "default"):
                ours = post_order(api, key)
            first = {"ours": ours, "theirs": other_host.result(timeout=60)}
        created = [name for name, answer in first.items() if answer.status_code == 201 and not was_replayed(answer)]
        if len(created) != 1:
            answers = {name: (answer.status_code, answer.text) for name, answer in first.items()}
            keys = rows_on_each_node(
                on_galera,
                "default",
                "SELECT id, user_id, order_id FROM idempotency_keys WHERE `key` = %s",
                (key,),
            )
            pytest.fail(
                f"the two hosts answered {answers}; the endpoint's writer is node {on_galera.writer()}, the other"
                f" host's node is at {other_proxy.upstream}; the key's rows on each node:\n{keys}\n{on_galera.status()}"
            )
        order_id = first[created[0]].json()["id"]
        (loser,) = set(first) - set(created)
        refused = first[loser].status_code == 503
        again = first[loser]
        if refused:
            assert again.headers["Retry-After"]
            again = (
                retry_until_answered(api, key)
                if loser == "ours"
                else until_answered(functools.partial(post_to, second_web, token, key))
            )
        assert again.status_code == 201 and was_replayed(again), (again.status_code, again.text)
        assert again.json()["id"] == order_id
        order_ids, logs = rows_of(user)
        assert order_ids[-1] == order_id and len(order_ids) == logs == tried
        paths.append(f"{loser}: " + ("refused at COMMIT (503), the retry replayed" if refused else "replayed at once"))
        if refused:
            break
    print(f"\nthe order sent to both hosts at once, each try: {paths}")
    assert "refused" in paths[-1], paths


def award_elsewhere(env: dict[str, str], award: dict) -> str:
    """Award through a consumer process of its own (`env` names its node); return `created`, or the error's code."""
    program = (
        "import json; from django.db import OperationalError; from credits.services import credit_award\n"
        f"try: print(credit_award(**json.loads({json.dumps(award)!r})).created)\n"
        "except OperationalError as refused: print(refused.args[0])"
    )
    return manage(env, "shell", "-v", "0", "-c", program).strip()


def credits_of(award: dict) -> int:
    return OrderCredit.objects.filter(order_id=award["order_id"]).count()


def test_one_award_taken_by_two_consumers_writing_to_two_nodes_credits_once(on_galera, proxy, other_proxy, galera_user):
    user = galera_user("award")
    credit_balance_ensure(user_id=user.pk)  # so each award is the balance's UPDATE and the credit's INSERT
    other = direct_env(("127.0.0.1", other_proxy.port))
    refusal = str(ER_LOCK_DEADLOCK)
    paths = []
    for tried in range(1, TRIES + 1):
        award = {"transaction_id": new_transaction_id(), "order_id": 20_000_000 + 10 * user.pk + tried}
        award.update(user_id=user.pk, total=4)
        # The message and its redelivery, taken by a consumer on each node: both awards held, then let go at once.
        hold_both(proxy, other_proxy)
        with ThreadPoolExecutor(max_workers=1) as pool:
            other_consumer = pool.submit(award_elsewhere, other, award)
            with through(proxy, "credits"):
                try:
                    ours = str(credit_award(**award).created)
                except OperationalError as refused:
                    ours = str(refused.args[0])
            first = {"ours": ours, "theirs": other_consumer.result(timeout=120)}
        if sorted(first.values()) not in (["False", "True"], [refusal, "True"]):
            fresh("credits")
            credits = rows_on_each_node(
                on_galera,
                "credits",
                "SELECT id, transaction_id FROM order_credits WHERE order_id = %s",
                (award["order_id"],),
            )
            pytest.fail(
                f"the two consumers' awards answered {first}; then {credits_of(award)} credit rows for the order, and "
                f"a balance of {CreditBalance.objects.get(user_id=user.pk).balance}, {2 * award['total'] * tried} due;"
                f" the endpoint's writer is node {on_galera.writer()}, the other consumer's node is at"
                f" {other_proxy.upstream}; the credit rows on each node:\n{credits}\n{on_galera.status()}"
            )
        if refusal in first.values():
            # The consumer retries an award refused with a deadlock (credits/retry.py): a duplicate now.
            fresh("credits")
            assert credit_award(**award).created is False
        fresh("credits")
        assert credits_of(award) == 1
        assert CreditBalance.objects.get(user_id=user.pk).balance == 2 * award["total"] * tried
        paths.append("refused at COMMIT (1213), the retry a duplicate" if refusal in first.values() else "a duplicate")
        if refusal in first.values():
            break
    print(f"\nthe award taken by both consumers at once, each try: {paths}")
    assert "refused" in paths[-1], paths
