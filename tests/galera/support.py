"""What the cluster's request-level tests share (testkit/processes.connections_through sends connections through a
proxy in front of the endpoint): placing an order as a client does, retrying it with its key through a failover, and
reading back what committed."""

import time
from collections.abc import Callable
from typing import Any

from django.db import connections
from rest_framework.test import APIClient

from orders.models import Order
from outbox.models import TransactionLog
from testkit.galera_cluster import NODES, GaleraCluster

# How long a client retrying with its key waits for a failover to end before the test gives up.
FAILOVER_SECONDS = 15


def fresh(*aliases: str) -> None:
    """Drop this thread's connections, so the next query opens one through the endpoint to today's writer."""
    for alias in aliases:
        connections[alias].close()


def post_order(client: APIClient, key: str):
    return client.post("/api/orders/", {"goods_name": "in doubt", "total": 3}, format="json", HTTP_IDEMPOTENCY_KEY=key)


def until_answered(send: Callable[[], Any]) -> Any:
    """Send again, as a client retrying with its key does, until the service answers other than 503."""
    started = time.monotonic()
    while True:
        response = send()
        if response.status_code != 503 or time.monotonic() - started > FAILOVER_SECONDS:
            return response
        time.sleep(0.5)


def retry_until_answered(client: APIClient, key: str):
    """Retry the order with the same key through this process, each time on a connection to today's writer."""

    def send():
        fresh("default")
        return post_order(client, key)

    return until_answered(send)


def other_node(cluster: GaleraCluster) -> int:
    """Return a node the endpoint does not write to."""
    writer = cluster.writer()
    assert writer is not None, f"the endpoint has no writer:\n{cluster.status()}"
    return next(node for node in NODES if node != writer)


def rows_of(user) -> tuple[list[int], int]:
    """Return the user's order ids and how many outbox rows name them, read from the writer."""
    fresh("default")
    order_ids = list(Order.objects.filter(user=user).values_list("id", flat=True))
    logs = TransactionLog.objects.filter(foreign_key__in=[str(order_id) for order_id in order_ids]).count()
    return order_ids, logs
