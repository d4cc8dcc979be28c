"""Wake-ups on commit: one per burst, none for a rollback, and a real worker that relays when woken."""

import json
import subprocess
import time

import pytest
from django.core.cache import caches
from django.db import transaction

from core.cache import shared_client
from orders.services import order_create
from outbox import wakeup
from outbox.drain import drain
from outbox.ids import new_transaction_id
from outbox.publisher import Publisher
from outbox.services import message_create, messages_retry_now
from outbox.tests.support import BASE_DIR, PYTHON
from testkit.processes import free_port, service_env, stop_processes

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def waker(monkeypatch):
    """A fresh waker in place of the process-wide one, so its send count belongs to this test."""
    fresh = wakeup.RelayWaker()
    monkeypatch.setattr(wakeup, "waker", fresh)
    return fresh


def settle(waker: wakeup.RelayWaker, quiet: float = 0.5, timeout: float = 10.0) -> int:
    """Wait until the waker has sent nothing new for `quiet` seconds; return its send count."""
    deadline = time.monotonic() + timeout
    last, since = waker.sent, time.monotonic()
    while time.monotonic() - since < quiet and time.monotonic() < deadline:
        time.sleep(0.02)
        if waker.sent != last:
            last, since = waker.sent, time.monotonic()
    return last


def stop_worker(worker: subprocess.Popen) -> None:
    """Stop a Celery worker subprocess: SIGTERM (warm shutdown), SIGKILL if it lingers."""
    stop_processes(worker, grace=15)


def test_a_committed_order_sends_one_relay_task(user, waker, outbox_queue):
    order_create(user=user, goods_name="tea", total=1)

    assert settle(waker) == 1
    (message,) = outbox_queue.get_all()
    headers = message.properties["application_headers"]
    assert headers["task"] == "outbox.relay"
    assert headers["expires"] is not None  # a wake-up stuck behind dead workers expires instead of piling up
    assert message.properties["expiration"] == str(wakeup.WAKE_EXPIRES_SECONDS * 1000)  # ... and the broker drops it
    assert message.properties["delivery_mode"] == 1  # a hint the sweeper stands in for: not written to disk
    assert message.properties["correlation_id"] == headers["id"] == headers["root_id"]


def test_a_rolled_back_order_never_wakes_the_relay(user, waker, outbox_queue):
    order_create(user=user, goods_name="tea", total=1, idempotency_key="k1")
    assert settle(waker) == 1
    outbox_queue.purge()

    # Same key again: the second transaction inserts an order and its log row, then rolls back on the key.
    replay = order_create(user=user, goods_name="tea", total=1, idempotency_key="k1")
    assert not replay.created
    with pytest.raises(RuntimeError), transaction.atomic():
        tx = new_transaction_id()
        message_create(transaction_id=tx, business="order", foreign_key="999", payload={"order_id": 999})
        raise RuntimeError("roll back")

    time.sleep(0.5)
    assert settle(waker) == 1
    assert outbox_queue.count() == 0


def test_a_burst_of_wakeups_becomes_a_few_tasks_and_the_last_one_follows_the_last_wakeup(outbox_queue):
    burst = wakeup.RelayWaker(interval=0.05)
    started = time.monotonic()
    for _ in range(1000):
        burst.wake()
    elapsed = time.monotonic() - started
    # A leading send, then at most one per interval while the burst lasts, then one trailing send.
    assert 1 <= settle(burst) <= 2 + elapsed / 0.05

    # Wake-ups spread over half a second: about one task per interval, and one more after the final wake-up.
    started = time.monotonic()
    while time.monotonic() - started < 0.5:
        burst.wake()
        sent_at_last_wake = burst.sent
        time.sleep(0.001)
    total = settle(burst)
    assert total > sent_at_last_wake
    assert total <= 3 + 0.5 / 0.05 + 3
    assert outbox_queue.count() == total


def test_processes_share_one_interval_and_each_still_sends_after_its_last_wakeup(outbox_queue):
    # Two wakers with one gate stand for two gunicorn workers: together they send about one task per interval.
    first, second = wakeup.RelayWaker(interval=0.05), wakeup.RelayWaker(interval=0.05)
    started = time.monotonic()
    while time.monotonic() - started < 0.5:
        first.wake()
        second.wake()
        sent_at_last_wake = (first.sent, second.sent)
        time.sleep(0.001)
    totals = (settle(first), settle(second))

    assert totals[0] > sent_at_last_wake[0] and totals[1] > sent_at_last_wake[1]
    # Without the gate each would send about 0.5 / 0.05 tasks on its own.
    assert sum(totals) <= 0.5 / 0.05 + 4
    assert outbox_queue.count() == sum(totals)


def sends_while_waking(waker: wakeup.RelayWaker, *, seconds: float, every: float) -> list[float]:
    """Wake `waker` every `every` seconds for `seconds`; return when (since the start) each of its sends was seen."""
    started, seen, sends = time.monotonic(), waker.sent, []
    while (elapsed := time.monotonic() - started) < seconds:
        waker.wake()
        if waker.sent != seen:
            sends.extend([elapsed] * (waker.sent - seen))
            seen = waker.sent
        time.sleep(every)
    return sends


def redis_second_begin() -> None:
    """Return just after the shared Redis' clock has turned to a new second (the wake-up rate's counting unit)."""
    client = shared_client(caches["default"])
    second = client.time()[0]
    while client.time()[0] == second:
        time.sleep(0.002)


def test_under_sustained_load_wakeups_fold_over_the_busy_interval_and_a_quiet_stream_keeps_the_short_one(
    outbox_queue,
):
    waker = wakeup.RelayWaker(interval=0.02, busy_interval=0.25, busy_rate=100)
    # A quiet stream, 25 commits a second: each one gets its own send, at most 20 ms after it.
    quiet = sends_while_waking(waker, seconds=1.0, every=0.04)
    assert len(quiet) >= 18

    # Hundreds of commits a second: once a second of them is counted, one send per 250 ms instead of one per 20 ms.
    # The rate is counted per second of Redis' clock: started late in one of its seconds, the busy stream would fill
    # that second's count within a tenth of a second and turn busy at once; started as a second begins, it turns busy
    # about a second in.
    redis_second_begin()
    busy = sends_while_waking(waker, seconds=3.0, every=0.001)
    late = [at for at in busy if at >= 2.0]
    assert len(late) <= 1.0 / 0.25 + 2, busy
    assert len([at for at in busy if at < 0.9]) >= 10  # before the first busy second was counted, the short gate
    total = settle(waker)
    assert total > len(quiet) + len(busy)  # the trailing send after the last commit still comes
    assert outbox_queue.count() == total


def test_with_the_cache_down_wakeups_are_still_sent(settings, outbox_queue):
    closed = free_port()
    settings.CACHES = {"default": {**settings.CACHES["default"], "LOCATION": f"redis://127.0.0.1:{closed}/0"}}
    waker = wakeup.RelayWaker(interval=0.05)
    waker.wake()
    assert settle(waker) == 1
    assert outbox_queue.count() == 1


@pytest.mark.slow
def test_a_real_worker_woken_on_commit_relays_the_order_without_any_sweeper(user, waker, outbox_queue, credits_queue):
    worker = subprocess.Popen(
        [PYTHON, "-m", "celery", "-A", "config", "worker", "-Q", "outbox", "-P", "solo", "--without-mingle",
         "--without-gossip", "--without-heartbeat", "-l", "info"],
        cwd=BASE_DIR,
        env=service_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        for line in worker.stderr:
            if "ready." in line:
                break
        placement = order_create(user=user, goods_name="tea", total=2)
        assert credits_queue.wait_for(1, timeout=15) == 1
        (message,) = credits_queue.get_all()
        assert message.properties["message_id"] == placement.order.transaction_id
    finally:
        stop_worker(worker)
        worker.stderr.close()


@pytest.mark.slow
def test_a_real_celery_worker_runs_award_credits_from_the_relayed_message(make_rows, credits_queue, tmp_path):
    ids = make_rows(3)
    publisher = Publisher()
    try:
        assert drain(publisher) == 3
    finally:
        publisher.close()
    out = tmp_path / "received.jsonl"
    worker = subprocess.Popen(
        [PYTHON, "-m", "celery", "-A", "outbox.tests.probe_worker", "worker", "-Q", "credits", "-P", "solo",
         "--without-mingle", "--without-gossip", "--without-heartbeat", "-l", "warning"],
        cwd=BASE_DIR,
        env=service_env(PROBE_OUT=str(out)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (not out.exists() or len(out.read_text().splitlines()) < 3):
            time.sleep(0.1)
    finally:
        stop_worker(worker)
    received = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["task_id"] for r in received) == ids
    from outbox.models import TransactionLog

    for r in received:
        assert r["message"] == TransactionLog.objects.get(id=r["task_id"]).payload


def test_retry_now_wakes_the_relay_once_committed_and_not_for_nothing(make_rows, waker, outbox_queue):
    dead = make_rows(2, status="dead", attempts=10)
    published = make_rows(1, status="published")

    assert messages_retry_now(ids=published) == 0
    assert settle(waker) == 0
    with transaction.atomic():
        assert messages_retry_now(ids=dead) == 2
        assert waker.sent == 0  # not before the rows are due for everyone to see
    assert settle(waker) == 1
    assert [m.properties["application_headers"]["task"] for m in outbox_queue.get_all()] == ["outbox.relay"]


def test_wakeups_fail_over_to_the_next_node_of_the_broker_url(user, monkeypatch, outbox_queue, settings):
    failover_url = f"amqp://guest:guest@127.0.0.1:1//;{settings.CELERY_BROKER_URL}"
    fresh = wakeup.RelayWaker(url=failover_url)
    monkeypatch.setattr(wakeup, "waker", fresh)

    order_create(user=user, goods_name="tea", total=1)

    assert settle(fresh) == 1
    assert len(outbox_queue.get_all()) == 1
