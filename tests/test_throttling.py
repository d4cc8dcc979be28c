"""The order throttle with the shared cache unreachable: it fails open, and says so once, not once per request."""

import logging
import math

import pytest

from core import throttling
from orders.models import Order
from testkit.processes import free_port
from testkit.redis_commands import RedisCommands

# Orders commit in their own transaction, as in production: no test case's transaction may hold them.
pytestmark = pytest.mark.usefixtures("committed_db")


@pytest.fixture
def redis_down(settings, monkeypatch):
    default = settings.CACHES["default"]
    settings.CACHES = {"default": {**default, "LOCATION": f"redis://127.0.0.1:{free_port()}/0"}}
    monkeypatch.setattr(
        throttling.cache_down, "last_warning_at", -math.inf
    )  # this test's warning, not an earlier one's


def test_orders_keep_flowing_when_the_cache_is_down_with_one_warning(api, settings, redis_down, caplog):
    settings.ORDERS_RATE_LIMIT = "1/minute"

    with caplog.at_level(logging.WARNING, logger="core.throttling"):
        statuses = [api.post("/api/orders/", {"goods_name": "tea", "total": 1}, format="json").status_code]
        statuses += [api.post("/api/orders/", {"goods_name": "tea", "total": 1}, format="json").status_code]

    assert statuses == [201, 201]
    assert Order.objects.count() == 2
    warnings = [r for r in caplog.records if r.name == "core.throttling"]
    assert len(warnings) == 1
    assert "rate limits are off" in warnings[0].getMessage()


def test_the_limit_holds_with_the_cache_up(api, settings):
    settings.ORDERS_RATE_LIMIT = "2/hour"

    statuses = [api.post("/api/orders/", {"goods_name": "tea", "total": 1}, format="json") for _ in range(3)]

    assert [r.status_code for r in statuses] == [201, 201, 429]
    assert 0 < int(statuses[-1].headers["Retry-After"]) <= 3600


def test_a_window_count_is_one_command_and_expires_with_its_window(settings, monkeypatch):
    from django.core.cache import caches

    cache = caches["default"]
    client = cache._cache.get_client(write=True)
    # This thread's commands only (another thread of the process may use the cache meanwhile), less a script's first
    # load on a server that does not know it yet.
    redis = RedisCommands(monkeypatch)

    counts = []
    sent = redis.during(lambda: counts.extend(throttling.window_count_incr(cache, "window-test", ttl=2) for _ in "abc"))

    assert counts == [1, 2, 3]
    assert sent == ["EVALSHA"] * 3  # one per request
    assert 0 < client.ttl(cache.make_and_validate_key("window-test")) <= 2
