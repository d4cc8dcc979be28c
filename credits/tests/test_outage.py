"""The credits outage module: the wait-and-call-again loop and the polling it does, against the real database."""

import pytest
from django.db import connections
from django.db.utils import OperationalError

from credits import outage
from credits.services import credits_database

# The loop closes and reopens the credits connection, as a worker does between tasks: no test transaction around it.
pytestmark = pytest.mark.django_db(transaction=True)

DOWN = OperationalError(2003, "Can't connect to MySQL server (injected)")


def test_a_call_that_fails_while_the_database_is_unreachable_is_made_again_once_it_answers(settings):
    settings.CREDITS_OUTAGE_WAIT_SECONDS = 5
    results = iter([DOWN, DOWN, "done"])

    def call():
        result = next(results)
        if isinstance(result, Exception):
            raise result
        return result

    assert outage.through_outage(call) == "done"
    assert connections[credits_database()].is_usable()


def test_an_error_that_is_not_an_outage_is_raised_at_once(settings):
    settings.CREDITS_OUTAGE_WAIT_SECONDS = 5
    calls = []

    def call():
        calls.append(1)
        raise OperationalError(1644, "injected: insert refused")

    with pytest.raises(OperationalError, match="insert refused"):
        outage.through_outage(call)
    assert len(calls) == 1


def test_an_outage_longer_than_the_wait_is_raised(settings, monkeypatch):
    settings.CREDITS_OUTAGE_WAIT_SECONDS = 0.2

    def call():
        raise DOWN

    # The injected fault: the server refuses every new connection for the whole wait.
    monkeypatch.setattr(connections[credits_database()], "ensure_connection", call)

    with pytest.raises(OperationalError, match="injected"):
        outage.through_outage(call)


def test_the_wait_returns_as_soon_as_the_database_takes_a_connection():
    assert outage.credits_database_wait(until=0) is True
