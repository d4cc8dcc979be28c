"""End to end: real `celery -A config worker -Q credits` processes, RabbitMQ and MariaDB, faults injected in MariaDB."""

import os
import re
import signal
import time
from datetime import datetime

import pytest
from django.db.models import Sum

from config.celery import app
from core.contract import AWARD_CREDITS_TASK, CREDITS_DEAD_QUEUE, CREDITS_QUEUE
from credits.models import CreditBalance, DeadLetter, OrderCredit
from credits.tests.support import (
    dead_queue_take,
    place_order,
    publish,
    queue_depth,
    queue_unacknowledged,
)
from orders.selectors import order_get
from testkit.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

RETRY_BASE_SECONDS = 0.4
MAX_RETRIES = 3
FAST_RETRIES = {"CREDITS_MAX_RETRIES": str(MAX_RETRIES), "CREDITS_RETRY_BASE_SECONDS": str(RETRY_BASE_SECONDS)}
LOG_TIME = r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): "


def outcomes(*workers, task_id: str = r"[^\]]+") -> list[str]:
    """Return the outcome of every finished award in the workers' logs ('awarded' or 'duplicate')."""
    pattern = rf"Task {re.escape(AWARD_CREDITS_TASK)}\[{task_id}\] succeeded in [^:]+: '(\w+)'"
    return [outcome for worker in workers for outcome in re.findall(pattern, worker.log())]


def logged_at(worker, what: str, task_id: str) -> datetime:
    match = re.search(LOG_TIME + rf"[^\]]+\] Task {re.escape(AWARD_CREDITS_TASK)}\[{task_id}\] {what}", worker.log())
    assert match, f"no '{what}' line for {task_id} in {worker.name}"
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")


def balance(user) -> int:
    return CreditBalance.objects.get(user_id=user.pk).balance


def assert_all_acknowledged(*workers) -> None:
    """Stop the workers; any message they held unacknowledged would now be back in the queue."""
    for worker in workers:
        worker.stop()
    assert queue_depth(CREDITS_QUEUE) == 0


def test_a_duplicate_delivery_is_acknowledged_and_changes_nothing(start_worker, user):
    worker = start_worker("dup", concurrency=2)
    order_id, payload = place_order(user=user, total=4)
    other_message = {**payload, "transaction_id": "a" * 32}
    publish(payload)
    publish(payload)
    publish(other_message)
    wait_for(lambda: len(outcomes(worker)) == 3, what="three deliveries handled")
    assert sorted(outcomes(worker)) == ["awarded", "duplicate", "duplicate"]
    assert OrderCredit.objects.filter(order_id=order_id).count() == 1
    assert balance(user) == 8
    assert not DeadLetter.objects.exists()
    assert_all_acknowledged(worker)
    assert queue_depth(CREDITS_DEAD_QUEUE) == 0


def test_two_workers_receiving_the_same_message_at_once_award_once(db_faults, start_worker, user):
    order_id, payload = place_order(user=user, total=6)
    db_faults.set(order_id, sleep=1.0)  # every insert attempt takes a second, so the two deliveries overlap
    first, second = start_worker("twin-a"), start_worker("twin-b")
    publish(payload)
    publish(payload)
    tx = payload["transaction_id"]
    wait_for(lambda: len(outcomes(first, second)) == 2, what="both deliveries handled")
    # Each worker got one copy, and both had it before either finished: they worked on it at the same time.
    assert len(outcomes(first)) == len(outcomes(second)) == 1
    received = max(logged_at(w, "received", tx) for w in (first, second))
    finished = min(logged_at(w, "succeeded", tx) for w in (first, second))
    assert received < finished
    assert sorted(outcomes(first, second)) == ["awarded", "duplicate"]
    assert len({connection_id for connection_id, _ in db_faults.attempts(order_id)}) == 2
    assert OrderCredit.objects.filter(order_id=order_id).count() == 1
    assert balance(user) == 12
    assert_all_acknowledged(first, second)


@pytest.mark.parametrize("victim", ["pool process", "whole worker"])
def test_a_worker_killed_mid_award_loses_nothing_and_doubles_nothing(db_faults, start_worker, user, victim):
    order_id, payload = place_order(user=user, total=5)
    db_faults.set(order_id, sleep=3.0)
    worker = start_worker("victim")
    publish(payload)
    wait_for(db_faults.pausing, what="the award to be inside its transaction")
    if victim == "pool process":
        # The worker's main process sees its child die and rejects the message with requeue (reject_on_worker_lost).
        os.kill(worker.pool_pids()[0], signal.SIGKILL)
    else:
        # The broker requeues what the dead connection held unacknowledged; another worker takes it.
        worker.kill(signal.SIGKILL)
    assert not OrderCredit.objects.filter(order_id=order_id).exists()
    survivors = [worker] if victim == "pool process" else [start_worker("successor")]
    db_faults.clear(order_id)
    wait_for(lambda: outcomes(*survivors), timeout=60, what="the redelivered message to be handled")
    # The award reached the server as one batch (credits.services.award_batch), which runs on to its COMMIT without
    # the client that sent it: the redelivery finds the credit there, as after a worker killed between commit and
    # acknowledgement.
    assert outcomes(*survivors) == ["duplicate"]
    assert len(db_faults.attempts(order_id)) == 2
    assert OrderCredit.objects.filter(order_id=order_id).count() == 1
    assert balance(user) == 10
    assert not DeadLetter.objects.exists()
    assert_all_acknowledged(*survivors)


def test_a_worker_killed_during_a_burst_loses_nothing_and_doubles_nothing(start_worker, make_user):
    users = [make_user() for _ in range(4)]
    # Big enough that an idle machine's worker is still at it when killed.
    payloads = [place_order(user=users[i % 4], total=1 + i % 9)[1] for i in range(4000)]
    worker = start_worker("burst", concurrency=2)
    publish(*payloads)
    wait_for(lambda: OrderCredit.objects.count() >= 50, timeout=60, what="the burst to be under way")
    worker.kill(signal.SIGKILL)
    if OrderCredit.objects.count() >= len(payloads):
        # Seen since the award became one round trip: the poll above can land after the whole burst on a fast run.
        pytest.skip("the burst finished before the kill: nothing was in flight to lose")
    successor = start_worker("after-burst", concurrency=2)
    # Done when nothing is left to deliver and the successor holds nothing: a redelivered duplicate it prefetched
    # but has not run yet would go back to the queue when it stops.
    wait_for(
        lambda: (
            queue_depth(CREDITS_QUEUE) == 0
            and OrderCredit.objects.count() == len(payloads)
            and queue_unacknowledged(CREDITS_QUEUE) == 0
        ),
        timeout=120,
        what="every delivery handled once, nothing left on the queue",
    )
    assert_all_acknowledged(successor)
    assert OrderCredit.objects.values("order_id").distinct().count() == len(payloads)
    for user in users:
        expected = 2 * sum(p["total"] for p in payloads if p["user_id"] == user.pk)
        assert OrderCredit.objects.filter(user_id=user.pk).aggregate(s=Sum("amount"))["s"] == expected
        assert balance(user) == expected
    assert not DeadLetter.objects.exists()


def test_a_failure_that_recovers_on_the_second_try_awards_once(db_faults, start_worker, user):
    order_id, payload = place_order(user=user, total=2)
    db_faults.set(order_id, refuse=1)
    worker = start_worker("flaky", **FAST_RETRIES)
    publish(payload)
    wait_for(lambda: outcomes(worker), what="the award")
    assert outcomes(worker) == ["awarded"]
    assert len(db_faults.attempts(order_id)) == 2
    assert worker.count(r"retry: Retry in") == 1
    assert balance(user) == 4
    assert not DeadLetter.objects.exists()
    assert_all_acknowledged(worker)
    assert queue_depth(CREDITS_DEAD_QUEUE) == 0


def test_a_database_connection_lost_mid_award_is_tried_again_on_a_new_connection_spending_no_retry(
    db_faults, start_worker, user
):
    order_id, payload = place_order(user=user, total=2)
    db_faults.set(order_id, sleep=2.0)
    worker = start_worker("cut", **FAST_RETRIES)
    publish(payload)
    (connection_id,) = wait_for(db_faults.pausing, what="the award to be inside its transaction")
    db_faults.kill_connection(connection_id)
    db_faults.clear(order_id)
    wait_for(lambda: outcomes(worker), timeout=60, what="the retried award")
    assert outcomes(worker) == ["awarded"]
    assert worker.count(r"retry: Retry in") == 0, "a lost connection is the database's fault, not the message's"
    assert len({cid for cid, _ in db_faults.attempts(order_id)}) == 2
    assert OrderCredit.objects.filter(order_id=order_id).count() == 1
    assert balance(user) == 4
    assert not DeadLetter.objects.exists()
    assert_all_acknowledged(worker)


def test_a_failure_that_never_recovers_is_dead_lettered_after_the_retries_then_replayed_once(
    db_faults, start_worker, user, staff_client
):
    order_id, payload = place_order(user=user, total=3)
    db_faults.set(order_id, refuse=1_000_000)
    worker = start_worker("doomed", **FAST_RETRIES)
    publish(payload)
    letter = wait_for(lambda: DeadLetter.objects.filter(order_id=order_id).first(), what="the dead letter")

    # Exactly the configured retries, each after a longer wait than the one before (at least half its ceiling).
    tried_at = [at for _, at in db_faults.attempts(order_id)]
    assert len(tried_at) == 1 + MAX_RETRIES
    gaps = [(later - earlier).total_seconds() for earlier, later in zip(tried_at, tried_at[1:], strict=False)]
    assert all(gap >= RETRY_BASE_SECONDS * 2**n / 2 for n, gap in enumerate(gaps)), gaps
    assert gaps[0] < gaps[-1], gaps
    assert (letter.attempts, letter.reason, letter.status) == (1 + MAX_RETRIES, "deadlock", "open")
    assert letter.payload == payload and letter.message_id == payload["transaction_id"]
    assert letter.first_failed_at < letter.last_failed_at

    # The broker holds the message itself in credits.dead, routed there by the dead-letter exchange.
    dead = wait_for(dead_queue_take, what="the message in credits.dead")
    assert len(dead) == 1
    assert dead[0]["kwargs"] == {"message": payload}
    assert dead[0]["headers"]["id"] == payload["transaction_id"]
    assert dead[0]["headers"]["retries"] == MAX_RETRIES
    assert dead[0]["headers"]["x-death"][0]["reason"] == "rejected"
    assert dead[0]["headers"]["x-death"][0]["queue"] == CREDITS_QUEUE
    assert worker.count(r": ERROR/") == 1
    assert order_get(user=user, order_id=order_id).credit_status == "dead_lettered"

    # The fault is fixed; an operator replays, twice; the order is credited once.
    db_faults.clear(order_id)
    for _ in range(2):
        staff_client.post("/admin/credits/deadletter/", {"action": "replay", "_selected_action": [letter.pk]})
    letter.refresh_from_db()
    assert (letter.status, letter.replayed_by) == ("replayed", "operator")
    assert OrderCredit.objects.filter(order_id=order_id).count() == 1
    assert balance(user) == 6
    assert order_get(user=user, order_id=order_id).credit_status == "awarded"


def test_malformed_messages_are_dead_lettered_at_once(start_worker, user):
    _, payload = place_order(user=user)
    worker = start_worker("strict", **FAST_RETRIES)
    app.send_task(
        AWARD_CREDITS_TASK, kwargs={"message": {**payload, "total": "ten"}}, task_id="m-total", queue=CREDITS_QUEUE
    )
    app.send_task(
        AWARD_CREDITS_TASK, kwargs={"message": {**payload, "schema_version": 0}}, task_id="m-v0", queue=CREDITS_QUEUE
    )
    app.send_task(AWARD_CREDITS_TASK, args=[payload], task_id="m-args", queue=CREDITS_QUEUE)
    wait_for(lambda: DeadLetter.objects.count() == 3, what="three dead letters")
    letters = {d.message_id: d for d in DeadLetter.objects.all()}
    assert {k: (d.reason, d.attempts) for k, d in letters.items()} == {
        "m-total": ("malformed", 1),
        "m-v0": ("unsupported_schema", 1),
        "m-args": ("malformed", 1),
    }
    assert letters["m-args"].payload == {"args": [payload], "kwargs": {}}
    dead = wait_for(lambda: (taken := dead_queue_take()) and taken, what="credits.dead")
    while len(dead) < 3:
        dead += wait_for(dead_queue_take, what="credits.dead")
    assert sorted((m["headers"]["id"], m["headers"]["retries"]) for m in dead) == [
        ("m-args", 0),
        ("m-total", 0),
        ("m-v0", 0),
    ]
    assert worker.count(r"retry: Retry in") == 0
    assert worker.count(r": ERROR/") == 3
    assert not OrderCredit.objects.exists()
    assert_all_acknowledged(worker)


def test_a_newer_version_never_reaches_a_consumer_that_does_not_accept_it_until_its_wait_runs_out(
    start_worker, user, settings
):
    """The relay routes it to credits.v2, which this consumer does not take; after its time to live the broker moves it
    to credits.expired, which every consumer takes, and this one records the version_not_supported dead letter."""
    settings.ORDER_MESSAGE_VERSION = 2
    settings.CREDITS_UNKNOWN_VERSION_WAIT_SECONDS = 3  # the relay gives the message its wait as time to live
    _, payload = place_order(user=user)
    worker = start_worker("v1-only", CREDITS_ACCEPTED_MESSAGE_VERSIONS="1")
    publish(payload)
    time.sleep(1)
    assert worker.count(r"award_credits\[\w+\] received") == 0, "the message waits in credits.v2"
    letter = wait_for(lambda: DeadLetter.objects.first(), what="the dead letter")
    assert (letter.reason, letter.attempts) == ("version_not_supported", 1)
    assert "took it from credits.v2" in letter.error
    (dead,) = wait_for(dead_queue_take, what="credits.dead")
    assert dead["headers"]["retries"] == 0
    assert worker.count(r"award_credits\[\w+\] received") == 1
    assert worker.count(r"failed \(\w+\), retry") == 0, "no retry spent"
    assert not OrderCredit.objects.exists()
    assert_all_acknowledged(worker)


def test_balance_equals_the_sum_of_entries_after_a_concurrent_burst_for_one_user(start_worker, user):
    payloads = [place_order(user=user, total=1 + i % 50)[1] for i in range(300)]
    workers = [start_worker("burst-a", concurrency=2), start_worker("burst-b", concurrency=2)]
    publish(*[message for payload in payloads for message in (payload, payload)])  # each twice, back to back
    wait_for(lambda: len(outcomes(*workers)) == 2 * len(payloads), timeout=120, what="every delivery handled")
    assert sorted(set(outcomes(*workers))) == ["awarded", "duplicate"]
    assert outcomes(*workers).count("awarded") == len(payloads)
    entries = OrderCredit.objects.filter(user_id=user.pk)
    assert entries.count() == len(payloads)
    assert balance(user) == entries.aggregate(s=Sum("amount"))["s"] == 2 * sum(p["total"] for p in payloads)
    assert not any(w.count("retry: Retry in") for w in workers), "no award should have needed a retry"
    assert_all_acknowledged(*workers)
