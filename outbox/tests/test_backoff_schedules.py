"""The outbox's two outage backoffs keep their schedules (the publish retry delay is tested in test_relay.py)."""

from outbox.outage import outage_backoff
from outbox.wakeup import failure_backoff


def test_the_relay_backs_off_an_outage_from_half_a_second_to_thirty_with_jitter():
    for failures in range(1, 13):
        ceiling = min(30.0, 0.5 * 2 ** (failures - 1))
        delays = [outage_backoff(failures) for _ in range(100)]
        assert all(ceiling / 2 <= delay <= ceiling for delay in delays)
        assert len(set(delays)) > 1
    assert outage_backoff(1_000) <= 30.0
    assert outage_backoff(20, cap=5.0) <= 5.0


def test_the_wake_up_thread_pauses_one_second_doubling_to_thirty_without_jitter():
    assert [failure_backoff(n) for n in range(1, 9)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert failure_backoff(1_000) == 30.0
