"""Failing fast while a dependency is known silent: the breaker itself, and the database and Redis clients using it."""

import threading
import time

import pytest
from django.core.cache import caches
from django.db import OperationalError, connections
from redis.exceptions import RedisError

from core.breaker import Breaker
from core.cache import cache_breaker, shared_client
from core.deadlines import ROLES, WEB, database_settings
from core.mysql.base import breaker_for
from testkit.processes import database_address
from testkit.silence import SilentLink, iptables_available


def test_a_closed_breaker_allows_every_call():
    breaker = Breaker("x", cooldown=60)
    assert all(breaker.allow() for _ in range(3))


def test_an_open_breaker_refuses_until_its_cooldown_then_lets_one_probe_through():
    breaker = Breaker("x", cooldown=0.2)
    breaker.failed()
    assert not breaker.allow()
    time.sleep(0.25)
    assert breaker.allow()  # the probe
    assert not breaker.allow()  # others, while the probe is out
    breaker.failed()  # the probe found it silent still
    assert not breaker.allow()
    time.sleep(0.25)
    assert breaker.allow()
    breaker.succeeded()
    assert breaker.closed and breaker.allow() and breaker.allow()


def test_only_one_of_many_threads_probes_at_a_time():
    breaker = Breaker("x", cooldown=0.0)
    breaker.failed()
    allowed = []
    threads = [threading.Thread(target=lambda: allowed.append(breaker.allow())) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert allowed.count(True) == 1


@pytest.fixture
def web_connection_through_a_link(transactional_db):
    """The `default` alias with the web's deadlines, reached through a SilentLink; restored afterwards."""
    connection = connections["default"]
    saved = {key: connection.settings_dict[key] for key in ("HOST", "PORT")}
    saved_options = dict(connection.settings_dict["OPTIONS"])
    with SilentLink(database_address("default")) as link:
        connection.close()
        connection.settings_dict.update(HOST="127.0.0.1", PORT=str(link.port))
        database_settings(connection.settings_dict, WEB)
        try:
            yield connection, link
        finally:
            link.heal()
            connection.close()
            connection.settings_dict.update(saved)
            connection.settings_dict["OPTIONS"] = saved_options
            connection.settings_dict["FAIL_FAST_SECONDS"] = None


def select_one(connection) -> tuple[str, float]:
    """Run SELECT 1 as a request would (its connection health-checked first); return the outcome and its seconds."""
    connection.close_if_unusable_or_obsolete()
    started = time.monotonic()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        outcome = "ok"
    except OperationalError as exc:
        outcome = str(exc)
    if connection.errors_occurred:
        connection.close_if_unusable_or_obsolete()
    return outcome, time.monotonic() - started


@pytest.mark.slow
@pytest.mark.skipif(not iptables_available(), reason="needs iptables and root (scripts/setup.sh)")
@pytest.mark.alone  # its bounds are timings: other workers' load would break them
def test_the_web_waits_out_a_silent_database_once_then_fails_fast_and_heals_after_it(web_connection_through_a_link):
    connection, link = web_connection_through_a_link
    assert select_one(connection)[0] == "ok"

    link.silence()
    outcome, seconds = select_one(connection)
    assert "Lost connection" in outcome
    assert seconds == pytest.approx(ROLES[WEB].read, abs=0.5)
    outcome, seconds = select_one(connection)
    assert "did not answer just now" in outcome and seconds < 0.1
    link.heal()

    time.sleep(ROLES[WEB].fail_fast + 0.1)
    assert select_one(connection)[0] == "ok"  # the probe
    assert breaker_for("default", ROLES[WEB].fail_fast).closed
    assert select_one(connection)[0] == "ok"


@pytest.mark.slow
@pytest.mark.skipif(not iptables_available(), reason="needs iptables and root (scripts/setup.sh)")
@pytest.mark.alone  # its bounds are timings: other workers' load would break them
def test_a_silent_redis_costs_one_command_its_timeout_and_the_others_fail_at_once(settings):
    with SilentLink(("127.0.0.1", 6379)) as link:
        settings.CACHES = {
            "default": {**settings.CACHES["default"], "LOCATION": f"redis://127.0.0.1:{link.port}/0"},
        }
        client = shared_client(caches["default"])
        assert client.ping()

        link.silence()
        timings = []
        for _ in range(5):
            started = time.monotonic()
            with pytest.raises(RedisError):
                client.get("key")
            timings.append(time.monotonic() - started)
        assert timings[0] >= 0.4  # the first waited for its timeout
        assert all(seconds < 0.05 for seconds in timings[1:]), timings
        link.heal()

        time.sleep(cache_breaker.cooldown + 0.1)
        assert client.ping()
        assert cache_breaker.closed


@pytest.mark.slow
@pytest.mark.skipif(not iptables_available(), reason="needs iptables and root (scripts/setup.sh)")
def test_an_idle_connection_to_a_silent_database_is_found_dead_by_keepalive_before_it_is_used(
    web_connection_through_a_link,
):
    from core.deadlines import KEEPALIVE_IDLE_SECONDS, KEEPALIVE_INTERVAL_SECONDS, KEEPALIVE_PROBES

    connection, link = web_connection_through_a_link
    assert select_one(connection)[0] == "ok"
    link.silence()
    assert connection.is_usable()  # nothing told it yet
    found_dead = KEEPALIVE_IDLE_SECONDS + KEEPALIVE_INTERVAL_SECONDS * KEEPALIVE_PROBES
    deadline = time.monotonic() + found_dead + 10
    while connection.is_usable() and time.monotonic() < deadline:
        time.sleep(0.5)
    # The health check of the next request sees it without a round trip, so that request opens a new connection
    # instead of waiting out its read deadline on this one.
    assert not connection.is_usable()
