"""The relay loop's bell: a live loop is rung in Redis instead of sent a task; a stopped or dead one is not."""

import signal
import subprocess
import threading
import time

import pytest
from django.conf import settings
from django.core.cache import caches

from orders.services import order_create
from outbox import bell, wakeup
from outbox.tasks import sweep
from outbox.tests.support import BASE_DIR, PYTHON
from testkit.processes import free_port, service_env
from testkit.waiting import wait_for


def raw_client():
    cache = caches["default"]
    return cache._cache.get_client(write=True)


def key(name: str) -> str:
    return caches["default"].make_and_validate_key(name)


def heartbeat_present() -> bool:
    return bool(raw_client().exists(key(bell.HEARTBEAT_KEY)))


@pytest.fixture
def listener():
    listening = bell.Listener()
    yield listening
    listening.close()


def test_with_no_loop_listening_the_gate_is_taken_and_a_task_is_needed():
    assert bell.ring(interval=10) == (bell.Ring.NO_LISTENER, 10)
    outcome, remaining = bell.ring(interval=10)
    assert outcome is bell.Ring.GATED  # the same gate as before, shared with older web processes
    assert 9 < remaining <= 10  # what remains of it: when this process may ring again
    assert raw_client().llen(key(bell.BELL_KEY)) == 0


def redis_second() -> int:
    return int(raw_client().time()[0])


def rate_then_ring(*, previous_second: int, **ring) -> tuple[bell.Ring, float] | None:
    """Record `previous_second` commits for the second before the Redis clock's current one, then ring.

    Return None if the clock moved on to another second meanwhile (the count would then be two seconds old).
    """
    now = redis_second()
    raw_client().hset(key(bell.RATE_KEY), mapping={"second": now - 1, "count": previous_second, "previous": 0})
    rang = bell.ring(**ring)
    return rang if redis_second() == now else None


def until_one_second(attempt):
    """Run `attempt` until it ran within one second of the Redis clock (at most a few tries)."""
    for _ in range(5):
        if (result := attempt()) is not None:
            return result
        raw_client().delete(key(bell.GATE_KEY))
    raise AssertionError("the Redis clock moved on during every try")


def test_after_a_busy_second_the_gate_is_taken_for_the_busy_interval():
    outcome, gate = until_one_second(
        lambda: rate_then_ring(previous_second=200, interval=10, busy_rate=200, busy_interval=40, commits=3)
    )
    assert (outcome, gate) == (bell.Ring.NO_LISTENER, 40)
    assert 39_000 < raw_client().pttl(key(bell.GATE_KEY)) <= 40_000
    fields = raw_client().hgetall(key(bell.RATE_KEY))
    assert (fields[b"previous"], fields[b"count"]) == (b"200", b"3")  # this second's count starts with these commits


def test_below_the_busy_rate_or_with_it_off_the_gate_keeps_its_interval():
    below = until_one_second(lambda: rate_then_ring(previous_second=199, interval=10, busy_rate=200, busy_interval=40))
    assert below == (bell.Ring.NO_LISTENER, 10)
    raw_client().delete(key(bell.GATE_KEY))
    off = until_one_second(lambda: rate_then_ring(previous_second=10_000, interval=10, busy_rate=0, busy_interval=40))
    assert off == (bell.Ring.NO_LISTENER, 10)


def test_commits_are_added_up_per_second_across_processes_and_an_idle_second_resets_the_rate():
    for _ in range(4):  # four web processes reporting within one second (no gate, so none is refused)
        bell.ring(interval=0, commits=50)
    fields = raw_client().hgetall(key(bell.RATE_KEY))
    assert int(fields[b"count"]) == 200 or int(fields[b"count"]) + int(fields[b"previous"]) == 200
    # A count more than one second old is not the previous second's: a gap of a second means a quiet tier.
    now = redis_second()
    raw_client().hset(key(bell.RATE_KEY), mapping={"second": now - 2, "count": 5000, "previous": 5000})
    bell.ring(interval=0)
    fields = raw_client().hgetall(key(bell.RATE_KEY))
    assert fields[b"previous"] == b"0" or redis_second() != now
    assert 0 < raw_client().pttl(key(bell.RATE_KEY)) <= bell.RATE_TTL_MS


def test_a_listening_loop_is_rung_once_however_often_the_web_rings(listener):
    stop = threading.Event()
    assert listener.wait(0.05, stop) is False  # beats, hears nothing
    assert listener.live and heartbeat_present()

    assert [bell.ring(interval=0)[0] for _ in range(3)] == [bell.Ring.RUNG] * 3
    assert raw_client().llen(key(bell.BELL_KEY)) == 1  # a loop drains everything due once, however many rang
    assert listener.wait(5, stop) is True
    assert listener.wait(0.05, stop) is False


def test_a_wait_ends_at_once_on_stop(listener):
    stop = threading.Event()
    stop.set()
    started = time.monotonic()
    assert listener.wait(30, stop) is False
    assert time.monotonic() - started < 5


def test_a_stopping_loop_takes_only_its_own_heartbeat_down(listener):
    listener.wait(0.02, threading.Event())
    other = bell.Listener()
    other.wait(0.02, threading.Event())  # a second loop refreshed the heartbeat after the first
    listener.close()
    assert heartbeat_present()
    other.close()
    assert not heartbeat_present()
    assert bell.ring(interval=0)[0] is bell.Ring.NO_LISTENER


def test_with_redis_down_the_loop_waits_on_a_timer_and_says_it_is_not_listening(settings):
    closed = free_port()
    settings.CACHES = {"default": {**settings.CACHES["default"], "LOCATION": f"redis://127.0.0.1:{closed}/0"}}
    down = bell.Listener()
    started = time.monotonic()
    assert down.wait(0.2, threading.Event()) is False
    assert time.monotonic() - started >= 0.2
    assert not down.live
    down.close()


def start_relay(**env: str) -> subprocess.Popen:
    """Start `manage.py relay_outbox` sharing this test's Redis keys, and wait until it listens for the bell."""
    relay = subprocess.Popen(
        [PYTHON, "manage.py", "relay_outbox"],
        cwd=BASE_DIR,
        env=service_env(CACHE_KEY_PREFIX=settings.CACHES["default"]["KEY_PREFIX"], **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(heartbeat_present, timeout=30, what="the relay to listen for the bell")
    except AssertionError:
        relay.kill()
        raise AssertionError(f"the relay never listened: {relay.communicate()}") from None
    return relay


@pytest.fixture
def waker(monkeypatch):
    fresh = wakeup.RelayWaker()
    monkeypatch.setattr(wakeup, "waker", fresh)
    return fresh


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_commit_rings_a_real_relay_loop_which_publishes_without_any_task(user, waker, outbox_queue, credits_queue):
    # Polling alone would not find the order for ten minutes: only the bell can bring it out in time.
    relay = start_relay(OUTBOX_IDLE_SECONDS="600")
    try:
        time.sleep(1.0)  # past the loop's first short waits, into a 600 s one
        placement = order_create(user=user, goods_name="tea", total=2)
        assert credits_queue.wait_for(1, timeout=30) == 1
        assert (waker.rung, waker.sent) == (1, 0)
        assert outbox_queue.count() == 0

        relay.send_signal(signal.SIGTERM)
        out, err = relay.communicate(timeout=30)
    finally:
        if relay.poll() is None:
            relay.kill()
            relay.communicate()
    assert relay.returncode == 0, err
    assert out.strip() == "stopped; published 1"
    assert [m.properties["message_id"] for m in credits_queue.get_all()] == [placement.order.transaction_id]

    # Stopped on its signal, the loop took its heartbeat down: the next wake-up is a task at once.
    assert not heartbeat_present()
    order_create(user=user, goods_name="tea", total=3)
    assert outbox_queue.wait_for(1) == 1
    assert (waker.rung, waker.sent) == (1, 1)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_killed_loop_loses_its_rings_to_the_sweep_then_the_web_sends_tasks(user, waker, outbox_queue, credits_queue):
    relay = start_relay()
    relay.kill()
    relay.communicate()
    assert heartbeat_present()  # a SIGKILL leaves the heartbeat until it expires

    lost = order_create(user=user, goods_name="tea", total=2)
    wait_for(lambda: waker.rung == 1, timeout=10, what="the bell rung once")
    assert waker.sent == 0 and credits_queue.count() == 0

    assert sweep() == 1  # beat's safety net relays what the dead loop was rung for
    assert [m.properties["message_id"] for m in credits_queue.get_all()] == [lost.order.transaction_id]

    wait_for(lambda: not heartbeat_present(), timeout=bell.HEARTBEAT_TTL_SECONDS + 5, what="the heartbeat to expire")
    order_create(user=user, goods_name="tea", total=3)
    assert outbox_queue.wait_for(1) == 1
    assert (waker.rung, waker.sent) == (1, 1)
