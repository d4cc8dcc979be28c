"""Message versions across a rolling upgrade: each path a version takes through the consumer, on the real broker.

A version the consumer accepts is awarded; a newer one goes back to the queue with its retries untouched until a
newer consumer takes it or the wait runs out (then a version_not_supported dead letter); an older one is
dead-lettered at once. The slow end-to-end rollout is tests/reliability/test_rollout.py.
"""

from datetime import timedelta
from unittest import mock

import pytest
from celery import states
from celery.canvas import Signature
from celery.exceptions import Reject, Retry
from django.conf import settings
from django.utils import timezone
from kombu.exceptions import OperationalError
from prometheus_client import REGISTRY

from core.contract import CREDITS_QUEUE
from credits import services
from credits.models import DeadLetter, OrderCredit
from credits.services import ReplayOutcome
from credits.tasks import (
    FIRST_FAILED_HEADER,
    NEWER_VERSION_FIRST_SEEN_HEADER,
    NEWER_VERSION_HANDBACKS_HEADER,
    award_credits,
)
from credits.tests.support import broker_reset, place_order, queue_take
from orders.models import Order

pytestmark = pytest.mark.django_db


def sample(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
def version_2(settings):
    settings.ORDER_MESSAGE_VERSION = 2


@pytest.fixture
def v1_consumer(settings):
    settings.CREDITS_ACCEPTED_MESSAGE_VERSIONS = frozenset({1})


@pytest.fixture
def credits_queue():
    """The credits queue of the test broker, empty before and after the test; yields a function taking its messages."""
    broker_reset()
    yield lambda: queue_take(CREDITS_QUEUE)
    broker_reset()


def consume_as_a_worker(payload: dict, *, retries: int = 0, headers: dict | None = None) -> Exception:
    """Run the task on one delivery as a worker does (not eager), and return what it raised to Celery."""
    award_credits.push_request(
        id=payload["transaction_id"],
        retries=retries,
        called_directly=False,
        is_eager=False,
        args=[],
        kwargs={"message": payload},
        headers=headers or {},
    )
    try:
        award_credits.run(message=payload)
    except (Retry, Reject) as raised:
        return raised
    finally:
        award_credits.pop_request()
    raise AssertionError("the task neither handed the message back nor rejected it")


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


def test_a_newer_version_goes_back_to_the_queue_spending_no_retry(user, version_2, v1_consumer, credits_queue):
    _, payload = place_order(user=user)
    handbacks_before = sample("creditshop_credits_version_handbacks_total")
    retries_before = sample("creditshop_credits_retries_total", reason="version_not_supported")
    before = timezone.now()

    raised = consume_as_a_worker(payload, retries=2, headers={FIRST_FAILED_HEADER: before.isoformat()})

    assert isinstance(raised, Retry)  # Celery acknowledges the delivery in hand, as after a retry
    (sent,) = credits_queue()
    assert sent["kwargs"] == {"message": payload}
    headers = sent["headers"]
    assert headers["retries"] == 2, "the retries it had, none spent"
    assert headers[NEWER_VERSION_HANDBACKS_HEADER] == 1
    assert timezone.datetime.fromisoformat(headers[NEWER_VERSION_FIRST_SEEN_HEADER]) >= before
    assert headers[FIRST_FAILED_HEADER] == before.isoformat()
    # After a backoff: the first hand-back waits like a first retry, half of it fixed.
    delay = (timezone.datetime.fromisoformat(headers["eta"]) - before).total_seconds()
    assert delay >= settings.CREDITS_RETRY_BASE_SECONDS / 2
    assert not DeadLetter.objects.exists()
    assert sample("creditshop_credits_version_handbacks_total") == handbacks_before + 1
    assert sample("creditshop_credits_retries_total", reason="version_not_supported") == retries_before


def test_a_hand_back_the_broker_refuses_puts_the_delivery_back(user, version_2, v1_consumer, credits_queue):
    _, payload = place_order(user=user)
    # The injected fault: the broker refuses the publish of the message handed back.
    with mock.patch.object(Signature, "apply_async", side_effect=OperationalError("broker down")):
        raised = consume_as_a_worker(payload)
    assert isinstance(raised, Reject) and raised.requeue is True
    assert "republishing failed" in str(raised.reason)
    assert not DeadLetter.objects.exists()


def test_each_hand_back_keeps_the_first_time_and_backs_off_further(
    user, version_2, v1_consumer, credits_queue, settings
):
    settings.CREDITS_RETRY_BASE_SECONDS = 1.0
    settings.CREDITS_RETRY_MAX_SECONDS = 60.0
    _, payload = place_order(user=user)
    first_seen = timezone.now() - timedelta(seconds=30)
    headers = {NEWER_VERSION_FIRST_SEEN_HEADER: first_seen.isoformat(), NEWER_VERSION_HANDBACKS_HEADER: 3}
    before = timezone.now()

    assert isinstance(consume_as_a_worker(payload, headers=headers), Retry)

    (sent,) = credits_queue()
    assert sent["headers"][NEWER_VERSION_HANDBACKS_HEADER] == 4
    assert sent["headers"][NEWER_VERSION_FIRST_SEEN_HEADER] == first_seen.isoformat()
    delay = (timezone.datetime.fromisoformat(sent["headers"]["eta"]) - before).total_seconds()
    assert delay >= 4.0, "the fourth hand-back waits like retry 3: 8 s, half of it fixed"
    assert not DeadLetter.objects.exists()


def test_a_newer_version_still_unclaimed_when_the_wait_runs_out_is_dead_lettered(
    user, version_2, v1_consumer, credits_queue, settings
):
    settings.CREDITS_UNKNOWN_VERSION_WAIT_SECONDS = 3600
    _, payload = place_order(user=user)
    first_seen = timezone.now() - timedelta(seconds=3601)
    headers = {NEWER_VERSION_FIRST_SEEN_HEADER: first_seen.isoformat(), NEWER_VERSION_HANDBACKS_HEADER: 40}
    dead_before = sample("creditshop_credits_dead_lettered_total", reason="version_not_supported")

    raised = consume_as_a_worker(payload, retries=0, headers=headers)

    assert isinstance(raised, Reject) and raised.requeue is False  # to credits.dead, through credits.dlx
    assert credits_queue() == [], "not handed back again"
    letter = DeadLetter.objects.get()
    assert (letter.reason, letter.attempts, letter.status) == ("version_not_supported", 1, "open")
    assert letter.first_failed_at == first_seen
    assert "40 hand-back(s)" in letter.error
    assert "newer than this consumer accepts" in letter.error
    assert sample("creditshop_credits_dead_lettered_total", reason="version_not_supported") == dead_before + 1
    assert not OrderCredit.objects.exists()


def test_no_wait_dead_letters_a_newer_version_at_once(user, version_2, v1_consumer, settings):
    settings.CREDITS_UNKNOWN_VERSION_WAIT_SECONDS = 0
    _, payload = place_order(user=user)
    result = award_credits.apply(kwargs={"message": payload}, task_id=payload["transaction_id"])
    assert result.state == states.REJECTED
    assert DeadLetter.objects.get().reason == "version_not_supported"


def test_run_eagerly_a_newer_version_is_put_back_not_dead_lettered(user, version_2, v1_consumer):
    _, payload = place_order(user=user)
    result = award_credits.apply(kwargs={"message": payload}, task_id=payload["transaction_id"])
    assert result.state == states.REJECTED
    assert not DeadLetter.objects.exists()
    assert not OrderCredit.objects.exists()


@pytest.mark.parametrize("version", [0, -3])
def test_a_version_older_than_every_accepted_one_is_dead_lettered_at_once(user, version, credits_queue):
    _, payload = place_order(user=user)
    raised = consume_as_a_worker({**payload, "schema_version": version})
    assert isinstance(raised, Reject) and raised.requeue is False
    assert credits_queue() == []
    letter = DeadLetter.objects.get()
    assert (letter.reason, letter.attempts) == ("unsupported_schema", 1)


def test_a_malformed_version_2_message_is_dead_lettered_at_once(user, version_2, credits_queue):
    _, payload = place_order(user=user)
    raised = consume_as_a_worker({**payload, "ordered_at": "last tuesday"})
    assert isinstance(raised, Reject) and raised.requeue is False
    assert credits_queue() == []
    assert DeadLetter.objects.get().reason == "malformed"


def test_a_dead_letter_of_a_version_now_accepted_is_replayed_once(user, version_2, settings):
    order_id, payload = place_order(user=user, total=3)
    settings.CREDITS_ACCEPTED_MESSAGE_VERSIONS = frozenset({1})
    settings.CREDITS_UNKNOWN_VERSION_WAIT_SECONDS = 0
    award_credits.apply(kwargs={"message": payload}, task_id=payload["transaction_id"])
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
