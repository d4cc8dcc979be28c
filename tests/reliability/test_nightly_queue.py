"""A nightly run in progress holds only its own worker: outbox wake-ups keep being relayed meanwhile."""

import pytest

from analytics.models import NightlyRun
from config.celery import app
from orders.services import order_create
from outbox.models import TransactionLog
from testkit.waiting import wait_for

pytestmark = pytest.mark.slow

# A day no other test reports on: each run holds a server-wide lock per day.
NIGHTLY_DAY = "2001-02-03"


def test_outbox_messages_are_relayed_while_a_nightly_run_is_in_progress(cluster, user):
    # A Spark master that never answers keeps the run in progress for about a minute (the driver retries
    # registering), without the CPU of a real Spark job.
    cluster.extra_env["SPARK_MASTER"] = "spark://127.0.0.1:9"
    # Beat sweeps every second (the harness's OUTBOX_SWEEP_SECONDS), so the outbox worker has work even if this
    # process's wake-up is lost (its broker connection may have been cut by an earlier fault test).
    cluster.start("outbox", "analytics", "beat")
    app.send_task("analytics.run_nightly", kwargs={"date": NIGHTLY_DAY})
    running = NightlyRun.objects.filter(status=NightlyRun.Status.RUNNING)
    wait_for(running.exists, timeout=90, what="the nightly run to start", details=lambda: cluster.logs("analytics"))

    order = order_create(user=user, goods_name="tea", total=1).order

    message = TransactionLog.objects.filter(id=order.transaction_id)
    wait_for(
        lambda: message.get().status == TransactionLog.Status.PUBLISHED,
        what="the order's message to be relayed",
        details=lambda: cluster.logs("outbox"),
    )
    assert running.exists(), "the nightly run ended before the message was relayed: the test proved nothing"
