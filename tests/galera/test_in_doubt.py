"""In-doubt commits on the cluster: the writer dies at COMMIT time and the client never learns whether its transaction
committed. Forced both ways (testkit/lost_answer.py): the answer lost after the commit, the COMMIT lost before it.
Either way the order and its outbox row are both there or both absent, the client's retry with its Idempotency-Key
gets one order, and the consumer's retry of an award whose answer was lost credits once.
"""

import time
import uuid

import pytest

from credits.models import CreditBalance, OrderCredit
from credits.services import credit_award, credit_balance_ensure
from outbox.ids import new_transaction_id
from testkit.galera_cluster import GALERA_CLUSTER_GROUP
from testkit.lost_answer import ANSWER_LOST, COMMIT_LOST
from testkit.processes import connections_through
from tests.galera.support import FAILOVER_SECONDS, fresh, post_order, retry_until_answered, rows_of

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.xdist_group(GALERA_CLUSTER_GROUP)]


def test_an_order_whose_commit_answer_is_lost_is_there_once_with_its_message(on_galera, proxy, client):
    user, api = client
    writer = on_galera.writer()
    key = uuid.uuid4().hex
    proxy.arm(ANSWER_LOST, lambda: on_galera.kill_node(writer))
    with connections_through(proxy.port, "default"):
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
    with connections_through(proxy.port, "default"):
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
    with connections_through(proxy.port, "credits"), pytest.raises(Exception) as lost:  # noqa: PT011 (whatever the driver raises)
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
