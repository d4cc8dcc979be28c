"""The relay's steps against the real MariaDB and RabbitMQ: claim, publish with confirms, mark, fail, die."""

import json
from datetime import timedelta

import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone
from kombu import Exchange, Queue
from prometheus_client import REGISTRY

from outbox import metrics
from outbox.claims import claim_due
from outbox.drain import drain, relay_batch
from outbox.marks import mark_failed, mark_published
from outbox.models import TransactionLog
from outbox.publisher import Publisher
from outbox.retry import retry_delay
from outbox.services import messages_retry_now

Status = TransactionLog.Status

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def publisher():
    publisher = Publisher()
    yield publisher
    publisher.close()


def counter_value(counter) -> float:
    """Read a counter as a scrape does: its sample in the default registry, not the object's internals."""
    (family,) = counter.describe()
    return REGISTRY.get_sample_value(f"{family.name}_total") or 0.0


def test_relay_batch_publishes_each_row_once_as_a_celery_task_and_marks_it(make_rows, credits_queue, publisher):
    ids = make_rows(30)
    published_before = counter_value(metrics.PUBLISHED)

    outcome = relay_batch(publisher, batch_size=50)

    assert (outcome.claimed, outcome.published, outcome.failed) == (30, 30, 0)
    rows = TransactionLog.objects.filter(id__in=ids)
    assert {row.status for row in rows} == {Status.PUBLISHED}
    assert all(row.published_at is not None and row.attempts == 0 for row in rows)
    assert counter_value(metrics.PUBLISHED) - published_before == 30

    messages = credits_queue.get_all()
    assert sorted(m.properties["message_id"] for m in messages) == ids
    message = messages[0]
    tx = message.properties["message_id"]
    headers = message.properties["application_headers"]
    assert headers["task"] == "credits.award_credits"
    assert headers["id"] == tx == message.properties["correlation_id"]
    assert message.properties["content_type"] == "application/json"
    assert message.properties["delivery_mode"] == 2
    args, kwargs, embed = json.loads(message.body)
    assert args == []
    assert kwargs == {"message": TransactionLog.objects.get(id=tx).payload}
    assert set(kwargs["message"]) == {"schema_version", "transaction_id", "order_id", "user_id", "total"}
    assert kwargs["message"]["transaction_id"] == tx
    assert embed["callbacks"] is None and embed["chain"] is None


def test_claim_takes_only_due_pending_rows_and_leases_them(make_rows):
    due = make_rows(15)
    make_rows(3, next_attempt_at=timezone.now() + timedelta(minutes=5))
    make_rows(2, status=Status.PUBLISHED)
    make_rows(2, status=Status.DEAD)

    first = claim_due(limit=10, lease_seconds=30)
    second = claim_due(limit=10, lease_seconds=30)
    third = claim_due(limit=10, lease_seconds=30)

    assert len(first.messages) == 10 and len(second.messages) == 5 and third.messages == []
    assert sorted(m.id for m in first.messages + second.messages) == due
    leased = TransactionLog.objects.filter(id__in=[m.id for m in first.messages])
    assert {row.next_attempt_at for row in leased} == {first.lease_until}
    assert first.lease_until > timezone.now() + timedelta(seconds=25)


def test_claim_refuses_to_run_inside_a_transaction(make_rows):
    make_rows(1)
    with transaction.atomic(), pytest.raises(RuntimeError, match="outside a transaction"):
        claim_due(limit=10)


def test_drain_relays_batch_after_batch_until_nothing_is_due(make_rows, credits_queue, publisher):
    ids = make_rows(120)

    assert drain(publisher, batch_size=50) == 120

    assert sorted(credits_queue.ids()) == ids
    assert TransactionLog.objects.filter(status=Status.PUBLISHED).count() == 120


@pytest.fixture
def tiny_queue(broker):
    """A queue that holds 3 messages and makes the broker nack every publish beyond that."""
    queue = Queue(
        "relay-test-tiny",
        Exchange("relay-test-tiny", type="direct", durable=False),
        routing_key="relay-test-tiny",
        durable=False,
        queue_arguments={"x-max-length": 3, "x-overflow": "reject-publish"},
    )
    channel = broker.channel()
    queue(channel).declare()
    queue(channel).purge()
    yield queue
    queue(channel).delete()


@override_settings(OUTBOX_BACKOFF_BASE_SECONDS=4.0, OUTBOX_BACKOFF_MAX_SECONDS=100.0)
def test_nacked_messages_stay_pending_with_one_more_attempt_and_a_backoff(make_rows, tiny_queue):
    ids = make_rows(5)
    publisher = Publisher(queue=tiny_queue)
    failed_before = counter_value(metrics.FAILED)
    try:
        claim = claim_due(limit=10)
        result = publisher.publish(claim.messages)
    finally:
        publisher.close()

    in_claim_order = [m.id for m in claim.messages]
    assert sorted(in_claim_order) == ids
    assert result.confirmed == in_claim_order[:3]
    assert result.failed == dict.fromkeys(in_claim_order[3:], "nacked by the broker")
    assert result.broker_error is None

    before = timezone.now()
    assert mark_published(claim, result.confirmed) == 3
    assert mark_failed(claim, result.failed) == (2, 0)

    for row in TransactionLog.objects.filter(id__in=in_claim_order[3:]):
        assert (row.status, row.attempts, row.last_error) == (Status.PENDING, 1, "nacked by the broker")
        # First retry: base * 2^0 = 4 s, equal jitter puts it in [2 s, 4 s].
        assert before + timedelta(seconds=1.9) <= row.next_attempt_at <= timezone.now() + timedelta(seconds=4)
    assert counter_value(metrics.FAILED) - failed_before == 2
    assert claim_due(limit=10).messages == []


def test_an_unroutable_message_is_a_failure_not_a_silent_loss(make_rows, broker):
    ids = make_rows(2)
    queue = Queue("relay-test-gone", Exchange("relay-test-gone", durable=False), routing_key="relay-test-gone")
    publisher = Publisher(queue=queue)
    try:
        publisher.connect()
        # The queue disappears after the relay declared it: the exchange now routes the messages nowhere.
        broker.channel().queue_delete("relay-test-gone")
        result = publisher.publish(claim_due(limit=10).messages)
    finally:
        publisher.close()
        broker.channel().exchange_delete("relay-test-gone")

    assert result.confirmed == []
    assert sorted(result.failed) == ids
    assert all(reason.startswith("unroutable") for reason in result.failed.values())


def test_a_confirm_that_never_comes_times_out_and_counts_as_a_failed_attempt(make_rows, broker_proxy, credits_queue):
    ids = make_rows(4)
    publisher = Publisher(url=broker_proxy.url, confirm_timeout=0.5)
    try:
        publisher.connect()
        broker_proxy.freeze()
        outcome = relay_batch(publisher, batch_size=10)
    finally:
        publisher.close()

    assert (outcome.claimed, outcome.published, outcome.failed) == (4, 0, 4)
    assert "no publisher confirm within 0.5 s" in str(outcome.broker_error)
    assert not publisher.connected
    rows = TransactionLog.objects.filter(id__in=ids)
    assert {(row.status, row.attempts) for row in rows} == {(Status.PENDING, 1)}
    assert all("ConfirmTimeout" in row.last_error for row in rows)


@pytest.mark.django_db  # no database at all; the module's transactional mark would flush both after it
@override_settings(OUTBOX_BACKOFF_BASE_SECONDS=2.0, OUTBOX_BACKOFF_MAX_SECONDS=300.0)
def test_backoff_doubles_per_attempt_up_to_the_cap_with_jitter():
    for attempts in range(1, 15):
        ceiling = min(300.0, 2.0 * 2 ** (attempts - 1))
        delays = [retry_delay(attempts) for _ in range(200)]
        assert all(ceiling / 2 <= delay <= ceiling for delay in delays)
        assert max(delays) - min(delays) > ceiling / 10  # jitter spreads retries that failed together
    assert retry_delay(1) <= 2.0 and retry_delay(9) >= 150.0


@override_settings(OUTBOX_MAX_ATTEMPTS=3)
def test_a_message_is_dead_after_the_last_allowed_attempt(make_rows, tiny_queue):
    # Fill the tiny queue so every further publish is nacked.
    filler = make_rows(3)
    publisher = Publisher(queue=tiny_queue)
    try:
        assert relay_batch(publisher, batch_size=10).published == 3
        victim = make_rows(1, attempts=1)[0]
        dead_before = counter_value(metrics.DEAD)

        outcome = relay_batch(publisher, batch_size=10)
        assert (outcome.failed, outcome.dead) == (1, 0)
        assert TransactionLog.objects.get(id=victim).attempts == 2

        TransactionLog.objects.filter(id=victim).update(next_attempt_at=timezone.now())
        outcome = relay_batch(publisher, batch_size=10)
    finally:
        publisher.close()

    assert (outcome.failed, outcome.dead) == (1, 1)
    row = TransactionLog.objects.get(id=victim)
    assert (row.status, row.attempts, row.last_error) == (Status.DEAD, 3, "nacked by the broker")
    assert counter_value(metrics.DEAD) - dead_before == 1
    assert claim_due(limit=10).messages == []
    assert TransactionLog.objects.filter(id__in=filler, status=Status.PUBLISHED).count() == 3


def test_marks_change_nothing_once_the_row_left_the_claim(make_rows, credits_queue, publisher):
    ids = make_rows(2)
    claim = claim_due(limit=10)
    # An operator's retry-now (or an expired lease re-claimed elsewhere) takes the rows away from this relay.
    assert messages_retry_now(ids=ids) == 2

    assert mark_published(claim, ids) == 0
    assert mark_failed(claim, dict.fromkeys(ids, "boom")) == (0, 0)
    assert {(row.status, row.attempts) for row in TransactionLog.objects.all()} == {(Status.PENDING, 0)}


def test_the_relay_fails_over_to_the_next_node_of_the_broker_url(make_rows, credits_queue, settings):
    # Two nodes that refuse connections, then the real broker: kombu alone would keep retrying the first.
    failover_url = f"amqp://guest:guest@127.0.0.1:1//;amqp://guest:guest@127.0.0.1:2//;{settings.CELERY_BROKER_URL}"
    publisher = Publisher(url=failover_url)
    ids = make_rows(5)
    try:
        outcome = relay_batch(publisher, batch_size=10)
    finally:
        publisher.close()

    assert (outcome.claimed, outcome.published, outcome.failed) == (5, 5, 0)
    assert sorted(m.properties["message_id"] for m in credits_queue.get_all()) == ids
