"""In-doubt commits on the cluster: the writer dies at COMMIT time and the client never learns whether its transaction
committed. Forced both ways (testkit/lost_answer.py): the answer lost after the commit, the COMMIT lost before it.
Either way the order and its outbox row are both there or both absent, the client's retry with its Idempotency-Key
gets one order, and the consumer's retry of an award whose answer was lost credits once.
"""

import contextlib
import time
import uuid

import pytest
from django.db import connections
from rest_framework.test import APIClient

from accounts.services import api_token_create
from credits.models import CreditBalance, OrderCredit
from credits.services import credit_award, credit_balance_ensure
from orders.models import Order
from outbox.ids import new_transaction_id
from outbox.models import TransactionLog
from testkit.galera_cluster import GALERA_CLUSTER_GROUP
from testkit.lost_answer import ANSWER_LOST, COMMIT_LOST, LostAnswerProxy

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.xdist_group(GALERA_CLUSTER_GROUP)]

FAILOVER_SECONDS = 15


@contextlib.contextmanager
def through(proxy: LostAnswerProxy, *aliases: str):
    """Send the aliases' connections through the proxy (in front of the endpoint) for a while."""
    saved = {
        alias: (connections[alias].settings_dict["HOST"], connections[alias].settings_dict["PORT"]) for alias in aliases
    }
    for alias in aliases:
        connections[alias].close()
        connections[alias].settings_dict.update(HOST="127.0.0.1", PORT=str(proxy.port))
    try:
        yield
    finally:
        for alias, (host, port) in saved.items():
            connections[alias].close()
            connections[alias].settings_dict.update(HOST=host, PORT=port)


def fresh(*aliases: str) -> None:
    """Drop this thread's connections, so the next query opens one through the endpoint to today's writer."""
    for alias in aliases:
        connections[alias].close()


def post_order(client: APIClient, key: str):
    return client.post("/api/orders/", {"goods_name": "in doubt", "total": 3}, format="json", HTTP_IDEMPOTENCY_KEY=key)


def retry_until_answered(client: APIClient, key: str):
    """Retry with the same key, as a client does, until the service answers other than 503."""
    started = time.monotonic()
    while True:
        fresh("default")
        response = post_order(client, key)
        if response.status_code != 503 or time.monotonic() - started > FAILOVER_SECONDS:
            return response
        time.sleep(0.5)


@pytest.fixture
def proxy(on_galera):
    with LostAnswerProxy(on_galera.endpoint) as proxy:
        yield proxy


@pytest.fixture
def client(galera_user):
    user = galera_user("indoubt")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {api_token_create(user=user)[1]}")
    return user, client


def rows_of(user) -> tuple[list[int], int]:
    """Return the user's order ids and how many outbox rows name them, read from the writer."""
    fresh("default")
    order_ids = list(Order.objects.filter(user=user).values_list("id", flat=True))
    logs = TransactionLog.objects.filter(foreign_key__in=[str(order_id) for order_id in order_ids]).count()
    return order_ids, logs


def test_an_order_whose_commit_answer_is_lost_is_there_once_with_its_message(on_galera, proxy, client):
    user, api = client
    writer = on_galera.writer()
    key = uuid.uuid4().hex
    proxy.arm(ANSWER_LOST, lambda: on_galera.kill_node(writer))
    with through(proxy, "default"):
        first = post_order(api, key)
    assert proxy.fired.is_set()
    assert first.status_code == 503
    # The commit was replicated before the writer answered: the next writer has the order and its message.
    order_ids, logs = rows_of(user)
    assert len(order_ids) == 1 and logs == 1
    retried = retry_until_answered(api, key)
    assert retried.status_code == 201 and retried.headers.get("Idempotent-Replayed") == "true"
    assert retried.json()["id"] == order_ids[0]
    assert rows_of(user) == (order_ids, 1)


def test_an_order_whose_commit_is_lost_is_absent_with_its_message_and_the_retry_places_it(on_galera, proxy, client):
    user, api = client
    writer = on_galera.writer()
    key = uuid.uuid4().hex
    proxy.arm(COMMIT_LOST, lambda: on_galera.kill_node(writer))
    with through(proxy, "default"):
        first = post_order(api, key)
    assert proxy.fired.is_set()
    assert first.status_code == 503
    assert rows_of(user) == ([], 0)
    retried = retry_until_answered(api, key)
    assert retried.status_code == 201 and "Idempotent-Replayed" not in retried.headers
    assert rows_of(user) == ([retried.json()["id"]], 1)


def test_an_award_whose_commit_answer_is_lost_credits_once_when_the_consumer_retries(on_galera, proxy, galera_user):
    user = galera_user("award")
    writer = on_galera.writer()
    award = {"transaction_id": new_transaction_id(), "order_id": 10_000_000 + user.pk, "user_id": user.pk, "total": 7}
    credit_balance_ensure(user_id=user.pk)  # so the award's batch is the next COMMIT
    proxy.arm(ANSWER_LOST, lambda: on_galera.kill_node(writer))
    with through(proxy, "credits"), pytest.raises(Exception) as lost:  # noqa: PT011 (whatever the driver raises)
        credit_award(**award)
    assert proxy.fired.is_set(), lost.value
    started = time.monotonic()
    while True:
        fresh("credits")
        try:
            retried = credit_award(**award)
            break
        except Exception:
            if time.monotonic() - started > FAILOVER_SECONDS:
                raise
            time.sleep(0.5)
    assert retried.created is False
    fresh("credits")
    assert OrderCredit.objects.filter(order_id=award["order_id"]).count() == 1
    assert CreditBalance.objects.get(user_id=user.pk).balance == 2 * award["total"]
