"""The credits benchmark's backlog: its orders and transaction_log rows written in bulk, the credits queues emptied,
and every message published as the relay publishes it (bench/relay_publish.py, run in the checkout compared).

Imported after django.setup(), as bench_credits.py does.
"""

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from kombu import Connection

from config.celery import app
from core.contract import BUSINESS_ORDER, CREDITS_DEAD_QUEUE, CREDITS_QUEUE, SCHEMA_VERSION
from credits.models import CreditBalance, DeadLetter, OrderCredit
from orders.models import Order
from outbox.ids import new_transaction_id
from outbox.models import TransactionLog

USER_PREFIX = "bench-credits-"
# Tracing off whatever this shell says: OTEL_SDK_DISABLED wins over every other OTEL_* variable (core/tracing.py).
TRACING_OFF = {"OTEL_SDK_DISABLED": "true"}
BATCH = 2000


def bench_cleanup() -> None:
    """Delete every row an earlier run of this bench wrote."""
    users = get_user_model().objects.filter(username__startswith=USER_PREFIX)
    user_ids = list(users.values_list("pk", flat=True))
    orders = Order.objects.filter(user__in=users)
    # Two databases: ids are read from one and used in the other, never joined.
    OrderCredit.objects.filter(user_id__in=user_ids).delete()
    CreditBalance.objects.filter(user_id__in=user_ids).delete()
    DeadLetter.objects.filter(order_id__in=list(orders.values_list("pk", flat=True))).delete()
    TransactionLog.objects.filter(
        business=BUSINESS_ORDER, foreign_key__in=[str(pk) for pk in orders.values_list("pk", flat=True)]
    ).delete()
    orders.delete()
    users.delete()


def orders_seed(*, messages: int, users: int) -> list[dict]:
    """Write the orders and their transaction_log rows in bulk; return the payloads the relay would publish."""
    user_model = get_user_model()
    user_model.objects.bulk_create([user_model(username=f"{USER_PREFIX}{i}") for i in range(users)])
    user_ids = list(user_model.objects.filter(username__startswith=USER_PREFIX).values_list("pk", flat=True))
    payloads = []
    for start in range(0, messages, BATCH):
        orders = [
            Order(
                user_id=random.choice(user_ids),
                goods_name="bench",
                total=random.randint(1, 100),
                transaction_id=new_transaction_id(),
            )
            for _ in range(min(BATCH, messages - start))
        ]
        Order.objects.bulk_create(orders)  # MariaDB returns the new ids (INSERT ... RETURNING)
        logs = []
        for order in orders:
            payload = {
                "schema_version": SCHEMA_VERSION,
                "transaction_id": order.transaction_id,
                "order_id": order.pk,
                "user_id": order.user_id,
                "total": order.total,
            }
            payloads.append(payload)
            logs.append(
                TransactionLog(
                    id=order.transaction_id,
                    business=BUSINESS_ORDER,
                    foreign_key=str(order.pk),
                    payload=payload,
                    status=TransactionLog.Status.PUBLISHED,
                )
            )
        TransactionLog.objects.bulk_create(logs)
    return payloads


def broker_prepare() -> None:
    """Declare and empty the credits queues; refuse to run while another consumer is attached."""
    with Connection(settings.CELERY_BROKER_URL) as conn:
        channel = conn.default_channel
        for name in (CREDITS_QUEUE, CREDITS_DEAD_QUEUE):
            queue = app.amqp.queues[name].bind(channel)
            queue.declare()
            if name == CREDITS_QUEUE and queue.queue_declare(passive=True).consumer_count:
                raise SystemExit("another consumer is attached to the credits queue; stop it first")
            queue.purge()


def publish_all(payloads: list[dict], *, duplicates: float, code_dir: Path | None = None) -> int:
    """Publish every payload as the relay does, plus re-deliveries of a random share; return how many were sent.

    The relay's own Publisher and message builder of `code_dir` (this checkout by default) write the messages
    (bench/relay_publish.py, run there), so a before/after comparison includes each side's message format.
    """
    deliveries = payloads + random.sample(payloads, int(len(payloads) * duplicates))
    random.shuffle(deliveries)
    created_at = time.time()
    # What the relay adds: the order request's trace context (here a made-up sampled one) and creation time.
    lines = "".join(
        json.dumps(
            {
                "payload": payload,
                "created_at": created_at,
                "traceparent": f"00-{random.getrandbits(128):032x}-{random.getrandbits(64):016x}-01",
            }
        )
        + "\n"
        for payload in deliveries
    )
    subprocess.run(
        [sys.executable, str(Path(__file__).resolve().parent / "relay_publish.py")],
        input=lines.encode(),
        cwd=code_dir or settings.BASE_DIR,
        env={**os.environ, **TRACING_OFF},
        check=True,
    )
    return len(deliveries)
