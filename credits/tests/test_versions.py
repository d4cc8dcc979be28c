"""Message versions across a rolling upgrade: each path a version takes through the consumer, on the real broker.

The relay routes each message to its version's queue (outbox/tests/test_publisher.py), and a consumer takes only the
queues of the versions it accepts, so a version it does not accept reaches it two ways only: on `credits`, from a
relay or consumer of the release before (forwarded to its version's queue, its retries untouched), or on
credits.expired after waiting out its version's queue (dead-lettered, version_not_supported, unless this consumer
accepts it after all). An older version is dead-lettered at once. The slow end-to-end rollout, with processes of the
release before, is tests/reliability/test_rollout.py.
"""

from unittest import mock

import pytest
from celery import states
from celery.canvas import Signature
from celery.exceptions import Reject, Retry
from django.db import OperationalError as DjangoOperationalError
from kombu.exceptions import OperationalError
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from core.contract import CREDITS_EXPIRED_QUEUE, CREDITS_QUEUE
from core.credits_queues import consumed_queue_names
from core.metrics import build_registry
from credits import services
from credits.headers import FIRST_FAILED_HEADER
from credits.models import DeadLetter, OrderCredit
from credits.services import ReplayOutcome
from credits.tasks import award_credits
from credits.tests.support import broker_reset, place_order, publish, queue_take
from orders.models import Order

# Orders commit in their own transaction, as in production: no test case's transaction may hold them.
pytestmark = pytest.mark.usefixtures("committed_db")

V2_QUEUE = "credits.v2"


def sample(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
def version_2(settings):
    settings.ORDER_MESSAGE_VERSION = 2


@pytest.fixture
def v1_consumer(settings):
    settings.CREDITS_ACCEPTED_MESSAGE_VERSIONS = frozenset({1})


@pytest.fixture
def queues():
    """The credits queues of the test broker, empty before and after the test; yields a function taking a queue's
    messages."""
    broker_reset()
    yield queue_take
    broker_reset()


def expired(queue: str = V2_QUEUE, reason: str = "expired") -> dict:
    """Return the headers RabbitMQ gives a message it dead-letters from `queue` into credits.expired."""
    return {"x-first-death-reason": reason, "x-first-death-queue": queue, "x-first-death-exchange": CREDITS_QUEUE}


def consume_as_a_worker(
    payload: dict, *, queue: str = CREDITS_QUEUE, retries: int = 0, headers: dict | None = None
) -> object:
    """Run the task on one delivery from `queue` as a worker does (not eager); return what it returned or raised."""
    award_credits.push_request(
        id=payload["transaction_id"],
        retries=retries,
        called_directly=False,
        is_eager=False,
        args=[],
        kwargs={"message": payload},
        headers=headers or {},
        delivery_info={"exchange": CREDITS_QUEUE, "routing_key": queue},
    )
    try:
        return award_credits.run(message=payload)
    except (Retry, Reject) as raised:
        return raised
    finally:
        award_credits.pop_request()


def test_a_version_2_message_dates_the_credit_by_its_order(user, version_2):
    order_id, payload = place_order(user=user, total=4)
    assert award_credits.apply(kwargs={"message": payload}, task_id=payload["transaction_id"]).get() == "awarded"
    credit = OrderCredit.objects.get(order_id=order_id)
    assert credit.ordered_at == Order.objects.get(pk=order_id).created_at
    assert credit.amount == 8


def test_a_version_1_message_leaves_the_order_time_unknown(user):
    order_id, payload = place_order(user=user)
    award_credits.apply(kwargs={"message": payload}, task_id=payload["transaction_id"]).get()
    assert OrderCredit.objects.get(order_id=order_id).ordered_at is None


def test_a_newer_version_on_credits_is_forwarded_to_its_version_queue_spending_no_retry(
    user, version_2, v1_consumer, queues, settings
):
    """A relay of the release before published it to `credits`: it goes on, once and at once, to credits.v2."""
    settings.CREDITS_UNKNOWN_VERSION_WAIT_SECONDS = 90
    _, payload = place_order(user=user)
    forwards_before = sample("creditshop_credits_version_forwards_total")
    retries_before = sample("creditshop_credits_retries_total", reason="version_not_supported")
    first_failed = "2026-01-02T03:04:05+00:00"

    returned = consume_as_a_worker(payload, retries=2, headers={FIRST_FAILED_HEADER: first_failed})

    assert returned == "forwarded"  # the delivery in hand is acknowledged
    assert queues(CREDITS_QUEUE) == []
    (sent,) = queues(V2_QUEUE)
    assert sent["kwargs"] == {"message": payload}
    headers = sent["headers"]
    assert headers["retries"] == 2, "the retries it had, none spent"
    assert headers[FIRST_FAILED_HEADER] == first_failed
    assert "eta" not in headers or headers["eta"] is None, "at once, no backoff"
    assert sent["properties"]["expiration"] == "90000", "it waits there at most CREDITS_UNKNOWN_VERSION_WAIT_SECONDS"
    assert not DeadLetter.objects.exists()
    assert sample("creditshop_credits_version_forwards_total") == forwards_before + 1
    assert sample("creditshop_credits_retries_total", reason="version_not_supported") == retries_before


def test_a_forward_the_broker_refuses_puts_the_delivery_back(user, version_2, v1_consumer, queues):
    _, payload = place_order(user=user)
    # The injected fault: the broker refuses the publish of the message forwarded.
    with mock.patch.object(Signature, "apply_async", side_effect=OperationalError("broker down")):
        raised = consume_as_a_worker(payload)
    assert isinstance(raised, Reject) and raised.requeue is True
    assert "forwarding to credits.v2 failed" in str(raised.reason)
    assert not DeadLetter.objects.exists()


def test_a_newer_version_that_waited_out_its_queue_is_dead_lettered(user, version_2, v1_consumer, queues):
    _, payload = place_order(user=user)
    dead_before = sample("creditshop_credits_dead_lettered_total", reason="version_not_supported")

    raised = consume_as_a_worker(payload, queue=CREDITS_EXPIRED_QUEUE, headers=expired())

    assert isinstance(raised, Reject) and raised.requeue is False  # to credits.dead, through credits.dlx
    assert queues(V2_QUEUE) == [], "not forwarded again"
    letter = DeadLetter.objects.get()
    assert (letter.reason, letter.attempts, letter.status) == ("version_not_supported", 1, "open")
    assert "newer than this consumer accepts" in letter.error
    assert f"no consumer that accepts it took it from {V2_QUEUE}" in letter.error
    assert sample("creditshop_credits_dead_lettered_total", reason="version_not_supported") == dead_before + 1
    assert not OrderCredit.objects.exists()


def test_a_message_that_waited_behind_a_backlog_is_awarded_by_a_consumer_that_accepts_it(user, version_2, queues):
    order_id, payload = place_order(user=user, total=4)
    assert consume_as_a_worker(payload, queue=CREDITS_EXPIRED_QUEUE, headers=expired()) == "awarded"
    assert OrderCredit.objects.get(order_id=order_id).amount == 8
    assert not DeadLetter.objects.exists()


def test_what_a_consumer_dead_lettered_from_a_version_queue_passes_on_untouched(user, version_2, queues):
    """Its dead letter was recorded when it was rejected from credits.v2; it is neither tried nor recorded again."""
    _, payload = place_order(user=user)
    for reason in ("rejected", "delivery_limit"):
        raised = consume_as_a_worker(payload, queue=CREDITS_EXPIRED_QUEUE, headers=expired(reason=reason))
        assert isinstance(raised, Reject) and raised.requeue is False
    assert not DeadLetter.objects.exists()
    assert not OrderCredit.objects.exists()


def test_a_retry_goes_to_the_queue_of_the_message_version(user, version_2, queues):
    """A version-2 message a relay of the release before put on `credits` is retried through credits.v2."""
    _, payload = place_order(user=user)
    deadlock = DjangoOperationalError(1213, "Deadlock found when trying to get lock")
    with mock.patch.object(services, "credit_award", side_effect=deadlock):
        raised = consume_as_a_worker(payload)
    assert isinstance(raised, Retry)
    assert queues(CREDITS_QUEUE) == []
    (sent,) = queues(V2_QUEUE)
    assert sent["headers"]["retries"] == 1


def test_run_eagerly_a_newer_version_is_put_back_not_dead_lettered(user, version_2, v1_consumer):
    _, payload = place_order(user=user)
    result = award_credits.apply(kwargs={"message": payload}, task_id=payload["transaction_id"])
    assert result.state == states.REJECTED
    assert not DeadLetter.objects.exists()
    assert not OrderCredit.objects.exists()


@pytest.mark.parametrize("version", [0, -3])
def test_a_version_older_than_every_accepted_one_is_dead_lettered_at_once(user, version, queues):
    _, payload = place_order(user=user)
    raised = consume_as_a_worker({**payload, "schema_version": version})
    assert isinstance(raised, Reject) and raised.requeue is False
    assert queues(CREDITS_QUEUE) == []
    letter = DeadLetter.objects.get()
    assert (letter.reason, letter.attempts) == ("unsupported_schema", 1)


def test_a_malformed_version_2_message_is_dead_lettered_at_once(user, version_2, queues):
    _, payload = place_order(user=user)
    raised = consume_as_a_worker({**payload, "ordered_at": "last tuesday"})
    assert isinstance(raised, Reject) and raised.requeue is False
    assert queues(CREDITS_QUEUE) == []
    assert DeadLetter.objects.get().reason == "malformed"


def test_a_dead_letter_of_a_version_now_accepted_is_replayed_once(user, version_2, v1_consumer, settings, queues):
    order_id, payload = place_order(user=user, total=3)
    consume_as_a_worker(payload, queue=CREDITS_EXPIRED_QUEUE, headers=expired())
    letter = DeadLetter.objects.get()
    assert letter.reason == "version_not_supported"

    # Replayed from a process that still accepts only version 1: it fails again, and stays open.
    assert services.dead_letter_replay(dead_letter_id=letter.pk, by="ops").outcome == ReplayOutcome.FAILED
    # The upgrade is done; two operators replay it.
    settings.CREDITS_ACCEPTED_MESSAGE_VERSIONS = frozenset({1, 2})
    outcomes = [services.dead_letter_replay(dead_letter_id=letter.pk, by=who).outcome for who in ("ops", "ops2")]

    assert outcomes == [ReplayOutcome.AWARDED, ReplayOutcome.NOT_OPEN]
    credit = OrderCredit.objects.get(order_id=order_id)
    assert (credit.amount, credit.ordered_at) == (6, Order.objects.get(pk=order_id).created_at)
    letter.refresh_from_db()
    assert (letter.status, letter.replayed_by, letter.attempts) == ("replayed", "ops", 2)


def test_a_consumer_takes_credits_the_queues_of_its_versions_and_credits_expired():
    assert consumed_queue_names({1, 2}) == [CREDITS_QUEUE, V2_QUEUE, CREDITS_EXPIRED_QUEUE]
    assert consumed_queue_names({1}) == [CREDITS_QUEUE, CREDITS_EXPIRED_QUEUE]
    # After a contract release drops version 1, `credits` is still taken: old relays and consumers may write to it.
    assert consumed_queue_names({2}) == [CREDITS_QUEUE, V2_QUEUE, CREDITS_EXPIRED_QUEUE]


def test_metrics_show_the_messages_waiting_per_version_and_their_consumers(user, version_2, queues):
    _, payload = place_order(user=user)
    publish(payload, payload)

    scraped = text_string_to_metric_families(generate_latest(build_registry()).decode())
    samples = {
        (s.name, s.labels["version"]): s.value for family in scraped for s in family.samples if "version" in s.labels
    }
    assert samples[("creditshop_credits_version_messages_waiting", "2")] == 2
    assert samples[("creditshop_credits_version_consumers", "2")] == 0
    assert samples[("creditshop_credits_version_messages_waiting", "1")] == 0
