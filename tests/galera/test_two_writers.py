"""Two writers on two nodes: what certification does to the service's own transactions.

Through the endpoint every process writes to one node, but during a move of the writes (or with endpoints on several
hosts that briefly disagree, docs/OPERATIONS.md) two nodes can take transactions on the same rows at once. No row lock
spans nodes: the later write set to reach certification is refused, and its client gets a deadlock, 1213 (at its
COMMIT, or at its next statement when the other's rows reach its node first). A relay's claim, held at its COMMIT by a
proxy (testkit/lost_answer.py, COMMIT_HELD) while a relay on another node claims, publishes and marks the same rows,
fails, and each message goes out once. Same-key pairs (tests/galera/pairs.py), one Idempotency-Key sent to two web
hosts on two nodes at once and one award taken by two consumers on two nodes at once, are judged by the rows every
node holds: each key made one order that both answers name, each order is credited once, and every acknowledgement is
stored.
"""

import os
import subprocess
import sys
import uuid

import pytest
from django.conf import settings
from django.db import OperationalError, connections

from accounts.services import api_token_create
from config.celery import app
from core.contract import CREDITS_QUEUE
from credits.services import credit_balance_ensure
from credits.tests.support import queue_depth
from outbox.drain import drain
from outbox.models import TransactionLog
from outbox.publisher import Publisher
from testkit.galera_cluster import GALERA_CLUSTER_GROUP
from testkit.harness import Cluster
from testkit.lost_answer import COMMIT_HELD
from testkit.processes import connections_through, free_port, mysql_url, service_env
from testkit.queues import purge_queues
from tests.galera.pairs import award_pairs_judged, award_side, order_pairs_judged, order_side, run_pairs
from tests.galera.support import fresh, other_node, post_order, rows_of

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.xdist_group(GALERA_CLUSTER_GROUP)]

ER_LOCK_DEADLOCK = 1213
ORDERS = 5
# Same-key pairs until this many were refused by certification (at most PAIRS). With the hot writes committed inside
# their batch (the fault these tests catch), award pairs went wrong at pairs 154, 172, 541 and 788 of 800 (one wrong
# per about 106 refusals): 200 refusals meet it in about 85 runs of 100. Order pairs went wrong once in 800 pairs
# (86 refused, at pair 265) and 3 times in 3,000: 1,000 pairs meet it in about 65 runs of 100. Fewer would prove less.
# GALERA_PAIRS and GALERA_CONFLICTS set a longer run (docs/OPERATIONS.md, "A Galera cluster").
PAIRS = int(os.environ.get("GALERA_PAIRS", "1000"))
CONFLICTS = int(os.environ.get("GALERA_CONFLICTS", "200"))
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
        with connections_through(proxy.port, "default"), pytest.raises(OperationalError) as refused:
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
def web_hosts(on_galera, tmp_path):
    """Two web hosts, each writing to its own node (as while the writes move, or with one endpoint per host)."""
    hosts = []
    try:
        for node in (1, 2):
            workdir = tmp_path / f"web-on-gal{node}"
            workdir.mkdir()
            host = Cluster(service_env=direct_env(on_galera.node_address(node)), workdir=workdir, port=free_port())
            hosts.append(host)
            host.start("web")
        yield hosts
    finally:
        for host in hosts:
            host.stop()


def test_one_key_sent_to_two_web_hosts_on_two_nodes_makes_one_order_every_answer_names(on_galera, client, web_hosts):
    user, _ = client
    token = api_token_create(user=user)[1]
    sides = [order_side(host.base_url, token) for host in web_hosts]
    outcome = run_pairs(sides, pairs=PAIRS, until_conflicts=CONFLICTS)
    print(f"\norder pairs: {outcome}")
    # That the two hosts raced at all: on a loaded machine (two test workers beside the cluster) fewer pairs meet
    # within certification's window, 92 of 1,000 in one run; a twentieth still shows the race happened.
    assert outcome.conflicts >= min(CONFLICTS, PAIRS // 20), outcome
    wrong = order_pairs_judged(on_galera, user.pk, outcome)
    assert not wrong, "\n".join(wrong[:20]) + f"\n{on_galera.status()}"


def test_one_award_taken_by_two_consumers_on_two_nodes_credits_once_and_says_so_once(on_galera, galera_user):
    user = galera_user("award")
    credit_balance_ensure(user_id=user.pk)  # so each award is the balance's UPDATE and the credit's INSERT
    total = 4
    sides = [award_side(on_galera.node_address(node), user.pk, total) for node in (1, 2)]
    outcome = run_pairs(sides, pairs=PAIRS, until_conflicts=CONFLICTS)
    print(f"\naward pairs: {outcome}")
    assert outcome.conflicts >= min(CONFLICTS, PAIRS // 10), outcome
    wrong = award_pairs_judged(on_galera, user.pk, total, outcome)
    assert not wrong, "\n".join(wrong[:20]) + f"\n{on_galera.status()}"
