"""The award_credits task run in-process (eagerly): outcomes, the retry policy's limit, dead letters, metrics."""

import logging
from unittest import mock

import pytest
from celery import states
from celery.canvas import Signature
from celery.exceptions import Reject
from django.db import connections
from django.db.utils import OperationalError as DatabaseOperationalError
from kombu.exceptions import OperationalError
from prometheus_client import REGISTRY

from core.logs import TraceContextFilter
from core.metrics import build_registry
from credits import outage, services
from credits.models import DeadLetter, OrderCredit
from credits.tasks import award_credits
from credits.tests.support import place_order

# Orders commit in their own transaction, as in production: no test case's transaction may hold them.
pytestmark = pytest.mark.usefixtures("committed_db")


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
    assert len([r for r in caplog.records if r.name == "credits.dead_letters" and r.levelno == logging.ERROR]) == 1
    assert sample("creditshop_credits_dead_lettered_total", reason="malformed") == before + 1


def refused(*args, **kwargs):
    """The injected fault: the database refuses the award with an error nobody foresaw (a trigger's SQLSTATE)."""
    raise DatabaseOperationalError(1644, "injected: insert refused")


def test_a_failure_not_known_to_be_permanent_is_retried_the_configured_number_of_times_then_dead_lettered(
    user, settings
):
    settings.CREDITS_MAX_RETRIES = 2
    _, payload = place_order(user=user)
    retries_before = sample("creditshop_credits_retries_total", reason="unexpected")
    with mock.patch.object(services, "credit_award", side_effect=refused):
        result = run(payload)
    assert result.state == states.REJECTED
    letter = DeadLetter.objects.get()
    assert (letter.reason, letter.attempts) == ("unexpected", 3)
    assert letter.payload == payload
    assert sample("creditshop_credits_retries_total", reason="unexpected") == retries_before + 2


# Waiting for the database closes its connection, as a worker does between tasks: no test transaction around it.
def test_an_unreachable_database_spends_no_retry_and_makes_no_dead_letter(user, settings):
    """While the credits database is down the message waits, then goes back to the queue as it was."""
    _, payload = place_order(user=user)
    settings.CREDITS_OUTAGE_WAIT_SECONDS = 0.3
    down = DatabaseOperationalError(2003, "Can't connect to MySQL server (injected)")
    retries_before = sample("creditshop_credits_retries_total", reason="database_unavailable")
    requeues_before = sample("creditshop_credits_outage_requeues_total")
    with (
        mock.patch.object(services, "credit_award", side_effect=down) as award,
        mock.patch.object(outage, "credits_database_wait", wraps=outage.credits_database_wait) as wait,
    ):
        result = run(payload)
    assert result.state == states.REJECTED
    assert award.call_count >= 2, "the award is tried again once the database takes a connection"
    assert wait.call_count >= 1
    assert not DeadLetter.objects.exists()
    assert sample("creditshop_credits_retries_total", reason="database_unavailable") == retries_before
    assert sample("creditshop_credits_outage_requeues_total") == requeues_before + 1


def test_an_award_interrupted_by_an_outage_completes_once_the_database_answers(user, monkeypatch):
    _, payload = place_order(user=user, total=4)
    outcomes = iter([DatabaseOperationalError(2013, "Lost connection (injected)")])
    real_award = services.credit_award

    def flaky(**kwargs):
        failure = next(outcomes, None)
        if failure is not None:
            connections["credits"].close()
            raise failure
        return real_award(**kwargs)

    with mock.patch.object(services, "credit_award", side_effect=flaky):
        assert run(payload).get() == "awarded"
    assert OrderCredit.objects.get(order_id=payload["order_id"]).amount == 8
    assert not DeadLetter.objects.exists()


def test_a_call_without_the_message_keyword_is_dead_lettered(user):
    _, payload = place_order(user=user)
    result = award_credits.apply(args=[payload], task_id="positional")
    assert result.state == states.REJECTED
    assert DeadLetter.objects.get().payload == {"args": [payload], "kwargs": {}}


def test_open_dead_letters_are_a_gauge_in_metrics(user):
    _, payload = place_order(user=user)
    run({**payload, "schema_version": 0})
    assert build_registry().get_sample_value("creditshop_credits_dead_letters_open") == 1


def test_a_retry_that_cannot_be_published_is_dead_lettered_with_a_row(user):
    _, payload = place_order(user=user)
    # As in a worker: not called directly, not eager; the broker refuses the retry's publish (the injected fault).
    award_credits.push_request(id=payload["transaction_id"], retries=0, called_directly=False, is_eager=False)
    try:
        with (
            mock.patch.object(services, "credit_award", side_effect=refused),
            mock.patch.object(Signature, "apply_async", side_effect=OperationalError("broker down")),
            pytest.raises(Reject),
        ):
            award_credits.run(message=payload)
    finally:
        award_credits.pop_request()
    letter = DeadLetter.objects.get()
    assert (letter.reason, letter.attempts) == ("unexpected", 1)
    assert "the retry could not be published" in letter.error


def test_the_records_an_award_logs_carry_its_transaction_id_and_later_records_do_not(user, caplog):
    _, payload = place_order(user=user)
    caplog.handler.addFilter(TraceContextFilter())
    with caplog.at_level(logging.ERROR, logger="credits"):
        run({**payload, "order_id": "seven"})  # dead-lettered: logs an error
    [record] = [r for r in caplog.records if r.name == "credits.dead_letters"]
    assert record.transaction_id == payload["transaction_id"]

    after = logging.LogRecord("credits.dead_letters", logging.ERROR, __file__, 0, "after the task", None, None)
    TraceContextFilter().filter(after)
    assert after.transaction_id == ""
