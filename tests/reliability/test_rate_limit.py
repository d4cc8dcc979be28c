"""The order rate limit holds across gunicorn worker processes: they count in the one shared Redis."""

import random
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from django.contrib.auth import get_user_model

from accounts.services import api_token_create
from orders.models import Order
from testkit.processes import free_port

pytestmark = pytest.mark.slow

LIMIT = 10
BURST = 40


def test_a_burst_across_four_workers_gets_exactly_the_limit(cluster):
    # The throttle counts per user id; an id no earlier run used keeps the count in Redis this test's own.
    user = get_user_model().objects.create_user(username="burst", id=random.randrange(10**8, 2**31 - 1))
    token = api_token_create(user=user)[1]
    cluster.port = free_port()
    cluster.web_workers = 4
    cluster.extra_env["ORDERS_RATE_LIMIT"] = f"{LIMIT}/hour"
    cluster.start("web")
    if time.time() % 3600 > 3600 - 30:  # the window is the clock hour: keep the burst inside one
        time.sleep(3600 - time.time() % 3600 + 1)

    def place(i: int) -> requests.Response:
        return requests.post(
            f"{cluster.base_url}/api/orders/",
            json={"goods_name": f"burst {i}", "total": 1},
            headers={"Authorization": f"Token {token}"},
            timeout=30,
        )

    with ThreadPoolExecutor(max_workers=BURST) as pool:
        responses = list(pool.map(place, range(BURST)))

    statuses = sorted(r.status_code for r in responses)
    assert statuses == [201] * LIMIT + [429] * (BURST - LIMIT), cluster.logs("web")
    assert all(0 < int(r.headers["Retry-After"]) <= 3600 for r in responses if r.status_code == 429)
    assert Order.objects.filter(user=user).count() == LIMIT
