"""Concurrent awards through the service, each thread on its own database connection, against the real MariaDB."""

import random
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connections
from django.db.models import Sum

from credits import services
from credits.models import CreditBalance, OrderCredit
from credits.tests.support import place_order

THREADS = 8


def run_concurrently(payloads: list[dict]) -> list:
    """Award every payload from THREADS threads started together; return each result or the exception raised."""
    barrier = threading.Barrier(THREADS)
    chunks = [payloads[i::THREADS] for i in range(THREADS)]

    def work(chunk: list[dict]) -> list:
        results = []
        try:
            barrier.wait()
            for payload in chunk:
                try:
                    results.append(
                        services.credit_award(
                            transaction_id=payload["transaction_id"],
                            order_id=payload["order_id"],
                            user_id=payload["user_id"],
                            total=payload["total"],
                        )
                    )
                except Exception as exc:  # collected and asserted on by the test
                    results.append(exc)
        finally:
            connections.close_all()
        return results

    with ThreadPoolExecutor(THREADS) as pool:
        return [result for chunk_results in pool.map(work, chunks) for result in chunk_results]


@pytest.mark.django_db(transaction=True)
def test_the_same_message_delivered_to_many_consumers_at_once_awards_once(user):
    order_id, payload = place_order(user=user, total=7)
    results = run_concurrently([payload] * THREADS * 3)
    assert not [r for r in results if isinstance(r, Exception)]
    assert sum(r.created for r in results) == 1
    assert OrderCredit.objects.filter(order_id=order_id).count() == 1
    assert CreditBalance.objects.get(user_id=user.pk).balance == 14


@pytest.mark.django_db(transaction=True)
def test_a_concurrent_burst_for_one_new_user_loses_nothing_and_never_deadlocks(user):
    # The user has no balance row yet, so the first awards also race to create it.
    payloads = [place_order(user=user, total=random.randint(1, 100))[1] for _ in range(120)]
    deliveries = payloads * 2
    random.shuffle(deliveries)
    results = run_concurrently(deliveries)
    errors = [r for r in results if isinstance(r, Exception)]
    assert not errors, errors[:3]
    assert sum(r.created for r in results) == len(payloads)
    entries = OrderCredit.objects.filter(user_id=user.pk)
    assert entries.count() == len(payloads)
    expected = 2 * sum(p["total"] for p in payloads)
    assert entries.aggregate(s=Sum("amount"))["s"] == expected
    assert CreditBalance.objects.get(user_id=user.pk).balance == expected
