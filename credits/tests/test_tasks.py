"""The award_credits task run in-process (eagerly): outcomes, the retry policy's limit, dead letters, metrics."""

import logging
from unittest import mock

import pytest
from celery import states
from celery.canvas import Signature
from celery.exceptions import Reject
from kombu.exceptions import OperationalError
from prometheus_client import REGISTRY

from config.metrics import build_registry
from credits.models import DeadLetter
from credits.tasks import award_credits
from credits.tests.support import place_order

pytestmark = pytest.mark.django_db


def run(payload, *, task_id: str | None = None):
    task_id = task_id or (payload.get("transaction_id") if isinstance(payload, dict) else None) or "some-id"
    return award_credits.apply(kwargs={"message": payload}, task_id=task_id)


def sample(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_message_is_awarded_then_its_repeat_is_a_duplicate(user):
    _, payload = place_order(user=user)
    awarded_before = sample("creditshop_credits_messages_total", outcome="awarded")
    assert run(payload).get() == "awarded"
    assert run(payload).get() == "duplicate"
    assert sample("creditshop_credits_messages_total", outcome="awarded") == awarded_before + 1


def test_a_malformed_message_is_dead_lettered_at_once_and_logged_once(user, caplog):
    _, payload = place_order(user=user)
    before = sample("creditshop_credits_dead_lettered_total", reason="malformed")
    with caplog.at_level(logging.ERROR, logger="credits"):
        result = run({**payload, "order_id": "seven"})
    assert result.state == states.REJECTED
    letter = DeadLetter.objects.get()
    assert (letter.reason, letter.attempts, letter.status) == ("malformed", 1, "open")
    assert letter.first_failed_at == letter.last_failed_at
    assert len([r for r in caplog.records if r.name == "credits.tasks" and r.levelno == logging.ERROR]) == 1
    assert sample("creditshop_credits_dead_lettered_total", reason="malformed") == before + 1


def test_a_transient_failure_is_retried_the_configured_number_of_times_then_dead_lettered(user, settings):
    settings.CREDITS_MAX_RETRIES = 2
    _, payload = place_order(user=user)
    missing = {**payload, "order_id": payload["order_id"] + 10_000}
    retries_before = sample("creditshop_credits_retries_total", reason="order_not_visible")
    result = run(missing)
    assert result.state == states.REJECTED
    letter = DeadLetter.objects.get()
    assert (letter.reason, letter.attempts) == ("order_not_visible", 3)
    assert letter.payload == missing
    assert sample("creditshop_credits_retries_total", reason="order_not_visible") == retries_before + 2


def test_a_call_without_the_message_keyword_is_dead_lettered(user):
    _, payload = place_order(user=user)
    result = award_credits.apply(args=[payload], task_id="positional")
    assert result.state == states.REJECTED
    assert DeadLetter.objects.get().payload == {"args": [payload], "kwargs": {}}


def test_open_dead_letters_are_a_gauge_in_metrics(user):
    _, payload = place_order(user=user)
    run({**payload, "schema_version": 9})
    assert build_registry().get_sample_value("creditshop_credits_dead_letters_open") == 1


def test_a_retry_that_cannot_be_published_is_dead_lettered_with_a_row(user):
    _, payload = place_order(user=user)
    missing = {**payload, "order_id": payload["order_id"] + 10_000}
    # As in a worker: not called directly, not eager; the broker refuses the retry's publish (the injected fault).
    award_credits.push_request(id=missing["transaction_id"], retries=0, called_directly=False, is_eager=False)
    try:
        with (
            mock.patch.object(Signature, "apply_async", side_effect=OperationalError("broker down")),
            pytest.raises(Reject),
        ):
            award_credits.run(message=missing)
    finally:
        award_credits.pop_request()
    letter = DeadLetter.objects.get()
    assert (letter.reason, letter.attempts) == ("order_not_visible", 1)
    assert "the retry could not be published" in letter.error
