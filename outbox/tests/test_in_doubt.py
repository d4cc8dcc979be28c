"""A claim whose COMMIT goes unanswered: committed or not, the relay's next drain sends its rows, not the lease's end.

The claim's lease is OUTBOX_LEASE_SECONDS (60 s): a claim that committed while its answer was lost (the server killed
at that moment, the link cut) would hide its rows that long, though nothing was sent. A proxy in front of this run's
MariaDB loses the answer to the claim's COMMIT (it committed) or the COMMIT itself (it did not); a transaction left
open on a connection of its own stands for a COMMIT held up in a silent link, which may still commit after the heal.
"""

from datetime import timedelta

import MySQLdb
import pytest
from django.db import OperationalError, connections
from django.utils import timezone

from outbox import statements
from outbox.claims import Claim, ClaimedMessage, claim_due, in_doubt
from outbox.drain import drain
from outbox.models import TransactionLog
from outbox.publisher import Publisher
from testkit.lost_answer import ANSWER_LOST, COMMIT_LOST, LostAnswerProxy
from testkit.processes import connections_through, database_address, free_port, server_arguments

pytestmark = pytest.mark.django_db(transaction=True)


def leased(ids: list[str]) -> set[str]:
    """Return which of the rows are hidden from every relay now (next_attempt_at in the future)."""
    return set(
        TransactionLog.objects.filter(id__in=ids, next_attempt_at__gt=timezone.now()).values_list("id", flat=True)
    )


def connect() -> MySQLdb.Connection:
    """A connection of the test's own to the transaction log's database, as the service's user."""
    alias = statements.database()
    return MySQLdb.connect(
        **server_arguments(alias),
        database=connections[alias].settings_dict["NAME"],
        connect_timeout=5,
        read_timeout=10,
        write_timeout=10,
    )


@pytest.fixture
def publisher():
    publisher = Publisher()
    yield publisher
    publisher.close()


@pytest.mark.parametrize("mode", [ANSWER_LOST, COMMIT_LOST])
def test_a_claim_whose_commit_goes_unanswered_is_sent_by_the_next_drain(mode, make_rows, credits_queue, publisher):
    ids = make_rows(5)
    with LostAnswerProxy(database_address()) as proxy, connections_through(proxy.port, statements.database()):
        proxy.arm(mode)
        with pytest.raises(OperationalError):
            drain(publisher)
        assert proxy.fired.is_set()

        # Committed, the claim hides its rows for the lease; lost, it left them due. Nothing was sent either way.
        assert leased(ids) == (set(ids) if mode == ANSWER_LOST else set())
        assert credits_queue.ids() == []

        assert drain(publisher) == 5

    assert sorted(credits_queue.ids()) == ids
    assert set(TransactionLog.objects.filter(id__in=ids).values_list("status", flat=True)) == {"published"}


def test_a_claim_in_doubt_is_kept_while_the_database_is_away_and_given_back_when_it_answers(make_rows):
    ids = make_rows(3)
    alias = statements.database()
    with LostAnswerProxy(database_address()) as proxy, connections_through(proxy.port, alias):
        proxy.arm(ANSWER_LOST)
        with pytest.raises(OperationalError):
            claim_due(limit=10)
    assert leased(ids) == set(ids)

    connection = connections[alias]
    saved = connection.settings_dict["PORT"]
    connection.close()
    connection.settings_dict["PORT"] = str(free_port())  # nothing listens there: refused at once
    try:
        with pytest.raises(OperationalError):
            claim_due(limit=10)
    finally:
        connection.close()
        connection.settings_dict["PORT"] = saved
    assert leased(ids) == set(ids)

    claim = claim_due(limit=10)

    assert sorted(message.id for message in claim.messages) == ids


def test_a_claim_in_doubt_whose_transaction_is_still_open_is_given_back_only_once_it_ended(make_rows):
    ids = make_rows(3)
    lease_until = timezone.now() + timedelta(seconds=60)
    held = connect()
    try:
        cursor = held.cursor()
        cursor.execute("START TRANSACTION")
        placeholders = ",".join(["%s"] * len(ids))
        cursor.execute(
            f"UPDATE {TransactionLog._meta.db_table} SET next_attempt_at = %s WHERE id IN ({placeholders})",  # noqa: S608
            [lease_until.replace(tzinfo=None), *ids],
        )
        in_doubt.keep(Claim([ClaimedMessage(id, {}, 0) for id in ids], lease_until), ConnectionError("held up"))

        # Its rows locked: nothing to give back yet, and nothing to claim (other relays skip them too).
        assert claim_due(limit=10).messages == []
        cursor.execute("COMMIT")  # the COMMIT that came late
    finally:
        held.close()
    assert leased(ids) == set(ids)

    claim = claim_due(limit=10)

    assert sorted(message.id for message in claim.messages) == ids
