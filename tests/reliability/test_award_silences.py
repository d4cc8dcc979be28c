"""The award under many silences: every balance stays the sum of its credits, every order is credited once.

The whole cluster's credits database silence (test_silence.py) silences the link once per run; one run of it ended
with a balance that was not the sum of its credits, unexplained (docs/RELIABILITY.md, "Open"). This test makes many
more tries at the moments a silence can catch an award: the award's own code
(credits.outage.through_outage around credits.services.credit_award, as the consumer calls it) on several threads,
some messages delivered twice, through a link to the credits database that goes silent again and again (packets
dropped both ways: testkit/silence.py) for longer than the read deadline. Each silence finds awards whose batch was
sent and never answered, whose answer was lost, and whose retry on a new connection after the heal races the old
batch's retransmission. It judges by what is stored, read past the link once it is quiet.

The second test: an award whose ROLLBACK and close a silence dropped leaves its transaction open on the server,
holding the user's balance row, until the server ends it at the workers' idle transaction limit (core/deadlines.py).
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import Counter

import MySQLdb
import pytest
from django.db import DatabaseError, connections

from core.deadlines import Deadlines, init_command
from credits import outage, services
from testkit.processes import connections_through, database_address
from testkit.silence import SilentLink, iptables_available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not iptables_available(), reason="needs iptables and root (scripts/setup.sh)"),
]

CREDITS = "credits"
THREADS = 4
USERS_PER_THREAD = 2
SECONDS = 30
# The awards' read deadline, shortened as the cluster's silence tests shorten the workers' (production's is 20 s).
READ_SECONDS = 2
DEADLINES = Deadlines(
    connect=2, read=READ_SECONDS, write=READ_SECONDS, statement=READ_SECONDS * 0.75, idle_transaction=READ_SECONDS
)
# Each silence outlasts the read deadline, some by little and some by more than TCP's next retransmission.
SILENT_SECONDS = (READ_SECONDS + 0.5, READ_SECONDS + 2.5)
HEARD_SECONDS = (0.3, 1.0)
# A message delivered twice, as after a worker died between its commit and its acknowledgement.
DELIVERED_TWICE = 0.3
# A delivery whose award raised is delivered again after a pause, as the retry policy does (credits/retry.py), for
# this long at most: an award may wait for a transaction an abandoned connection left open in a silence, until the
# server ends it (the idle transaction limit).
REDELIVERY_PAUSE_SECONDS = 0.5
REDELIVERY_SECONDS = 60
# Between two awards on a thread: the test needs concurrency and silences, not throughput.
PAUSE_SECONDS = 0.005
# Once the last silence healed: long enough for the retransmissions of batches sent into a silence to arrive.
QUIET_SECONDS = 15


@pytest.fixture
def credits_link(transactional_db):
    """A SilentLink in front of the credits database, and this process's `credits` connections given the awards'
    deadlines for the test; a test sends them through the link with connections_through."""
    settings_dict = connections[CREDITS].settings_dict
    saved_options = dict(settings_dict["OPTIONS"])
    connections[CREDITS].close()
    options = settings_dict["OPTIONS"]
    options.update(DEADLINES.options())
    options["init_command"] = init_command(saved_options.get("init_command", ""), DEADLINES)
    try:
        with SilentLink(database_address(CREDITS)) as link:
            yield link
    finally:
        connections[CREDITS].close()
        settings_dict["OPTIONS"] = saved_options


def direct() -> MySQLdb.Connection:
    """A connection of its own straight to the credits database's server, past any link."""
    return MySQLdb.connect(**connections[CREDITS].get_connection_params())


def test_awards_through_many_silences_keep_every_balance_the_sum_of_its_credits(credits_link, summary):
    link = credits_link
    rng = random.Random(4711)
    order_ids = itertools.count(1_000_000)
    tally: Counter = Counter()
    delivered: dict[int, tuple[int, int]] = {}  # order id -> (user id, total)
    lock = threading.Lock()
    stop = time.monotonic() + SECONDS

    def deliver(order_id: int, user_id: int, total: int) -> None:
        give_up = time.monotonic() + REDELIVERY_SECONDS
        while time.monotonic() < give_up:
            started = time.monotonic()
            try:
                award = outage.through_outage(
                    lambda: services.credit_award(
                        transaction_id=f"{order_id:032x}", order_id=order_id, user_id=user_id, total=total
                    )
                )
            except DatabaseError as exc:
                with lock:
                    tally[f"delivered again after {type(exc).__name__} {exc.args[0] if exc.args else ''}"] += 1
                time.sleep(REDELIVERY_PAUSE_SECONDS)
                continue
            with lock:
                tally["awarded" if award.created else "duplicate"] += 1
                tally["met a silence"] += time.monotonic() - started > READ_SECONDS
            return
        with lock:
            tally["never awarded"] += 1

    def awards(thread: int) -> None:
        users = [1 + thread * USERS_PER_THREAD + k for k in range(USERS_PER_THREAD)]
        try:
            while time.monotonic() < stop:
                with lock:
                    order_id, user_id, total = next(order_ids), rng.choice(users), rng.randint(1, 50)
                    twice = rng.random() < DELIVERED_TWICE
                    delivered[order_id] = (user_id, total)
                for _ in range(2 if twice else 1):
                    deliver(order_id, user_id, total)
                time.sleep(PAUSE_SECONDS)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=awards, args=(n,)) for n in range(THREADS)]
    silences = 0
    with connections_through(link.port, CREDITS):
        for thread in threads:
            thread.start()
        while time.monotonic() < stop - SILENT_SECONDS[1]:
            time.sleep(rng.uniform(*HEARD_SECONDS))
            with link.silenced():
                time.sleep(rng.uniform(*SILENT_SECONDS))
            silences += 1
        for thread in threads:
            thread.join()
    quiet_until = time.monotonic() + QUIET_SECONDS
    while link.connections() and time.monotonic() < quiet_until:
        time.sleep(0.5)
    open_after_quiet = link.connections()

    credits, balances = stored_credits_and_balances(direct())
    doubled = {order_id: n for order_id, (n, _, _) in credits.items() if n != 1}
    missing = set(delivered) - set(credits)
    wrong = {
        order_id
        for order_id, (_, user_id, amount) in credits.items()
        if order_id in delivered and (user_id, amount) != (delivered[order_id][0], 2 * delivered[order_id][1])
    }
    owed = Counter()
    for _, user_id, amount in credits.values():
        owed[user_id] += amount
    mismatched = {
        user_id: (balance, owed[user_id]) for user_id, balance in balances.items() if balance != owed[user_id]
    }
    summary(
        f"{silences} silences over {SECONDS} s, {len(delivered):,} orders on {THREADS} threads: {dict(tally)}; "
        f"stored {len(credits):,} credits; doubled {len(doubled)}, missing {len(missing)}, wrong {len(wrong)}, "
        f"balances not their credits' sum {mismatched or 0}; link connections left after the quiet: {open_after_quiet}"
    )
    assert tally["met a silence"] > 0 and silences >= 5, dict(tally)
    assert tally["never awarded"] == 0, dict(tally)
    assert (doubled, missing, wrong) == ({}, set(), set())
    assert set(credits) == set(delivered)
    assert mismatched == {}


def stored_credits_and_balances(connection) -> tuple[dict[int, tuple[int, int, int]], dict[int, int]]:
    """Per order id its credits' count, user and amount; per user its balance."""
    with connection:
        cursor = connection.cursor()
        cursor.execute("SELECT order_id, COUNT(*), MIN(user_id), MIN(total) FROM order_credits GROUP BY order_id")
        credits = {order_id: (n, user_id, amount) for order_id, n, user_id, amount in cursor.fetchall()}
        cursor.execute("SELECT user_id, balance FROM credit_balances")
        balances = dict(cursor.fetchall())
    return credits, balances


def test_an_award_whose_rollback_is_lost_in_a_silence_does_not_hold_its_users_balance_row(credits_link, monkeypatch):
    """A redelivered award's batch fails on its duplicate and leaves its transaction open, holding the user's balance
    row, for the award to roll back; here the link goes silent just then, so neither the ROLLBACK nor the close the
    award falls back on reaches the server. The server ends that transaction at the idle transaction limit
    (core/deadlines.py), and the user's next award goes through; without the limit it would wait for that row until
    the session's wait_timeout, hours."""
    link = credits_link
    user_id, first, second = 9_001, 2_000_001, 2_000_002

    def award(order_id: int) -> services.CreditAward:
        return outage.through_outage(
            lambda: services.credit_award(
                transaction_id=f"{order_id:032x}", order_id=order_id, user_id=user_id, total=10
            )
        )

    abandon = services.sql_batches.transaction_abandon

    def silenced_first(connection) -> None:
        link.silence()
        abandon(connection)

    with connections_through(link.port, CREDITS):
        assert award(first).created
        monkeypatch.setattr(services.sql_batches, "transaction_abandon", silenced_first)
        with pytest.raises(DatabaseError):  # the duplicate, then no answer to the ROLLBACK or to a new connection
            services.credit_award(transaction_id=f"{first:032x}", order_id=first, user_id=user_id, total=10)
        monkeypatch.undo()
    assert link.silent  # and stays so: the old connection's close never reaches the server

    # The user's next award, straight to the server.
    started = time.monotonic()
    while True:
        try:
            awarded = award(second)
            break
        except DatabaseError:  # the balance row still locked: the statement limit, then delivered again
            assert time.monotonic() - started < 4 * READ_SECONDS, "the balance row stayed locked"
            time.sleep(REDELIVERY_PAUSE_SECONDS)
    assert awarded.created

    credits, balances = stored_credits_and_balances(direct())
    assert {order_id: n for order_id, (n, _, _) in credits.items()} == {first: 1, second: 1}
    assert balances[user_id] == 2 * 10 + 2 * 10
