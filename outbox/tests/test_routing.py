"""The relay routes each credits message by its schema_version: `credits` for version 1, `credits.vN` after, each
queue declared by the relay before its first message, a later version's message with its wait as time to live."""

import time

import pytest
from kombu import Connection

from config.celery import app
from core.contract import CREDITS_QUEUE, credits_queue_name
from credits.tests.support import broker_reset, queue_take
from outbox.claims import ClaimedMessage
from outbox.ids import new_transaction_id
from outbox.publisher import Publisher
from outbox.tests.support import make_payload


@pytest.fixture
def queues(settings):
    broker_reset()
    with Connection(settings.CELERY_BROKER_URL) as conn:
        conn.default_channel.queue_delete("credits.v3")
    yield queue_take
    broker_reset()
    with Connection(settings.CELERY_BROKER_URL) as conn:
        conn.default_channel.queue_delete("credits.v3")


def message(version) -> ClaimedMessage:
    tx = new_transaction_id()
    return ClaimedMessage(id=tx, payload={**make_payload(tx, 1), "schema_version": version}, attempts=0)


def test_credits_queue_names():
    assert [credits_queue_name(v) for v in (1, 2, 3, 0, None, "2", True)] == [
        "credits",
        "credits.v2",
        "credits.v3",
        "credits",
        "credits",
        "credits",
        "credits",
    ]


def test_each_message_goes_to_its_version_queue_in_one_batch(queues, settings):
    settings.CREDITS_UNKNOWN_VERSION_WAIT_SECONDS = 120
    batch = [message(1), message(2), message(1), message(3), message("x")]
    publisher = Publisher()
    try:
        result = publisher.publish(batch)
    finally:
        publisher.close()
    assert sorted(result.confirmed) == sorted(m.id for m in batch), result.failed

    on_credits = queues(CREDITS_QUEUE)
    assert [m["headers"]["id"] for m in on_credits] == [batch[0].id, batch[2].id, batch[4].id]
    assert all("expiration" not in m["properties"] for m in on_credits), "a version-1 message never expires"
    (v2,) = queues("credits.v2")
    assert (v2["headers"]["id"], v2["properties"]["expiration"]) == (batch[1].id, "120000")
    # A version this code does not know yet gets its queue too, declared like the others.
    (v3,) = queues("credits.v3")
    assert v3["headers"]["id"] == batch[3].id
    with Connection(settings.CELERY_BROKER_URL) as conn:
        declared = app.amqp.queues["credits.v2"].queue_arguments
        assert declared["x-dead-letter-routing-key"] == "credits.expired"
        # Declaring credits.v3 again with the arguments of credits.v2 is accepted: they are the same.
        conn.default_channel.queue_declare("credits.v3", durable=True, auto_delete=False, arguments=declared)


def test_a_message_whose_time_runs_out_reaches_credits_expired(queues, settings):
    settings.CREDITS_UNKNOWN_VERSION_WAIT_SECONDS = 0.05
    publisher = Publisher()
    try:
        sent = message(2)
        assert publisher.publish([sent]).confirmed == [sent.id]
    finally:
        publisher.close()
    time.sleep(0.5)
    assert queues("credits.v2") == []
    (landed,) = queues("credits.expired")
    assert landed["headers"]["id"] == sent.id
    assert (landed["headers"]["x-first-death-reason"], landed["headers"]["x-first-death-queue"]) == (
        "expired",
        "credits.v2",
    )
