"""Restarting every process type the way an operator does, while orders flow: nothing lost, duplicated or refused.

Each test places a steady stream of orders (each client retrying with its Idempotency-Key), stops one process type
on its signal (docs/OPERATIONS.md, "Stopping and restarting"), starts it again, and checks every acknowledged order
was stored and credited once, no answer was a 5xx or a refused connection, and orders stayed fast meanwhile. Each
prints how long the process took to stop and the order p99 during the restart (`pytest tests/reliability -s`).
"""

import contextlib
import math
import os
import shelve
import time
from datetime import date, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from accounts.services import api_token_create
from analytics.models import NightlyRun
from analytics.runs import lock_name
from outbox.models import TransactionLog
from testkit.load import Backends, Ledger, OrderStream
from testkit.processes import free_port
from testkit.reconcile import wait_for_credits
from testkit.restarts import (
    RESTART_P99_LIMIT_SECONDS,
    Restart,
    assert_clean_restart,
    reload_gunicorn,
    reload_gunicorn_gapless,
    restart,
    restart_behind_other,
    restart_mid_nightly_run,
)
from testkit.waiting import wait_for

# The order p99 bound (RESTART_P99_LIMIT_SECONDS) is a timing: the first pass's load would break it. The web's restarts
# run alone; the other processes' beside one other test at most (`paired`), the p99 measured so.
pytestmark = pytest.mark.slow

RATE = 20  # orders per second, across all clients
DRAIN_LIMIT_SECONDS = 60
# A day no other test reports on: each nightly run holds a server-wide lock per day.
NIGHTLY_DAY = "2001-03-04"


@contextlib.contextmanager
def orders_flowing(cluster, make_user, *, backends=None):
    """Place orders at RATE while the block runs, then wait until every one is credited; yield the ledger."""
    users = [make_user(f"restart{i}") for i in range(4)]
    tokens = [api_token_create(user=u)[1] for u in users]
    ledger = Ledger()
    stream = OrderStream(backends or cluster.base_url, tokens, rate=RATE, ledger=ledger)
    stream.start()
    try:
        time.sleep(3)
        yield ledger
        time.sleep(3)
    finally:
        stream.stop()
    ledger.result, ledger.drained_in = wait_for_credits(ledger, [u.pk for u in users], timeout=DRAIN_LIMIT_SECONDS)


def report(summary, ledger: Ledger, restarts: list[Restart]) -> None:
    summary(
        "\n".join(
            [
                f"load average {os.getloadavg()}; client statuses {dict(ledger.statuses)}",
                *("  " + item.summary(ledger) for item in restarts),
                f"  {ledger.result}; all credited {ledger.drained_in:.1f} s after the stream stopped",
            ]
        )
    )


def assert_all_well(
    cluster, ledger: Ledger, restarts: list[Restart], *names: str, p99_limit: float = RESTART_P99_LIMIT_SECONDS
) -> None:
    ledger.result.assert_nothing_lost_or_duplicated(logs="\n".join(cluster.logs(name) for name in names))
    assert ledger.result.dead_letters == 0
    assert_clean_restart(restarts, ledger, p99_limit=p99_limit)
    assert cluster.restarts == {}, "a process exited on its own"


def leased_rows() -> int:
    """Count pending rows a relay has claimed (leased into the future) and not yet marked."""
    soon = timezone.now() + timedelta(seconds=5)
    return TransactionLog.objects.filter(
        status=TransactionLog.Status.PENDING, attempts=0, next_attempt_at__gt=soon
    ).count()


@pytest.mark.alone
def test_gunicorn_hup_reload_refuses_and_loses_nothing(cluster, make_user, summary):
    cluster.start("web", "relay", "credits")
    with orders_flowing(cluster, make_user) as ledger:
        restarts = [reload_gunicorn(cluster), reload_gunicorn(cluster)]
    report(summary, ledger, restarts)
    # No latency bound here: on HUP gunicorn stops the old workers as soon as it has forked the new ones, so orders
    # wait in the listen backlog for as long as a new worker takes to boot (0.2 s of CPU, seconds on a loaded
    # machine). The gapless reload below is the one to deploy with; this one must still lose and refuse nothing.
    assert_all_well(cluster, ledger, restarts, "web", p99_limit=math.inf)


@pytest.mark.alone
def test_gunicorn_gapless_reload(cluster, make_user, summary):
    cluster.start("web", "relay", "credits")
    with orders_flowing(cluster, make_user) as ledger:
        restarts = [reload_gunicorn_gapless(cluster), reload_gunicorn_gapless(cluster)]
    report(summary, ledger, restarts)
    assert_all_well(cluster, ledger, restarts, "web")


@pytest.mark.alone
def test_gunicorn_stop_and_start_behind_a_second_instance(cluster, make_user, summary):
    cluster.second_port = free_port()
    cluster.start("web", "web2", "relay", "credits")
    backends = Backends(*cluster.web_urls.values())
    with orders_flowing(cluster, make_user, backends=backends) as ledger:
        restarts = [restart_behind_other(cluster, backends, "web"), restart_behind_other(cluster, backends, "web2")]
    report(summary, ledger, restarts)
    assert_all_well(cluster, ledger, restarts, "web", "web2")


# Each relays alone in its test, so what it leaves leased nobody else would hide: the relay loop, or the outbox
# worker (wake-ups and beat's sweep), whose task in hand finishes before it exits.
RELAYS = {
    "relay": (("web", "relay", "credits"), "stopped; published"),
    "outbox": (("web", "outbox", "beat", "credits"), "Warm shutdown"),
}


@pytest.mark.paired
@pytest.mark.parametrize("relay", RELAYS)
def test_a_relay_finishes_its_batch_and_leaves_nothing_leased(cluster, make_user, summary, relay):
    processes, stopped_line = RELAYS[relay]
    cluster.start(*processes)
    left_leased = []
    with orders_flowing(cluster, make_user) as ledger:
        restarts = [restart(cluster, relay, while_stopped=lambda: left_leased.append(leased_rows())) for _ in range(2)]
    report(summary, ledger, restarts)
    assert_all_well(cluster, ledger, restarts, relay)
    assert left_leased == [0, 0]
    log = cluster.logs(relay, tail=10_000)
    assert log.count(stopped_line) == 2 and "WorkerLostError" not in log, log[-3000:]


@pytest.mark.paired
@pytest.mark.parametrize("pool", ["prefork", "solo"])
def test_credits_worker_warm_shutdown(cluster, make_user, summary, pool):
    # prefork as the harness runs it; solo as docs/OPERATIONS.md runs the consumer.
    cluster.process_args["credits"] = ["-P", pool]
    cluster.start("web", "relay", "credits")
    with orders_flowing(cluster, make_user) as ledger:
        restarts = [restart(cluster, "credits") for _ in range(2)]
    report(summary, ledger, restarts)
    assert_all_well(cluster, ledger, restarts, "credits")
    log = cluster.logs("credits", tail=10_000)
    assert "WorkerLostError" not in log and "Retry in" not in log, log[-3000:]


@pytest.mark.paired
def test_beat_restart_keeps_its_schedule_and_sends_nothing_twice(cluster, make_user, summary):
    cluster.start("web", "relay", "outbox", "beat", "credits")
    schedule = cluster.workdir / "beat-schedule"
    counts = []

    def saved_run_counts() -> None:
        # The file beat itself wrote in this test's directory.
        with shelve.open(str(schedule), flag="r") as saved:  # noqa: S301
            counts.append({name: entry.total_run_count for name, entry in saved["entries"].items()})

    with orders_flowing(cluster, make_user) as ledger:
        sweeps = "Sending due task outbox-sweep"
        restarts = []
        for _ in range(2):
            wanted = cluster.logs("beat", tail=10_000).count(sweeps) + 2
            wait_for(
                lambda wanted=wanted: cluster.logs("beat", tail=10_000).count(sweeps) >= wanted,
                what="beat to send two sweeps",
            )
            restarts.append(restart(cluster, "beat", while_stopped=saved_run_counts))
    report(summary, ledger, restarts)
    assert_all_well(cluster, ledger, restarts, "beat")
    # The schedule was saved on each stop and taken up again: the sweep's count went on from where it was.
    first, second = counts
    assert 0 < first["outbox-sweep"] < second["outbox-sweep"]
    # Nothing but the sweep was due in the test's minute: a restart sent none of the hourly or nightly entries.
    assert {name: n for name, n in second.items() if name != "outbox-sweep"} == dict.fromkeys(
        set(second) - {"outbox-sweep"}, 0
    )
    sent = {
        line.split("Sending due task ")[1].split()[0]
        for line in cluster.logs("beat", 10_000).splitlines()
        if "Sending due task" in line
    }
    assert sent == {"outbox-sweep"}


@pytest.mark.paired
@pytest.mark.spark
def test_analytics_worker_stopped_mid_run_records_it_interrupted_and_the_requeued_run_succeeds(
    cluster, make_user, summary
):
    # A Spark master that never answers keeps the first run in progress (the driver retries registering), without
    # the CPU of a real Spark job; the worker started again runs the requeued day on a small local master.
    analytics_env = cluster.process_env.setdefault("analytics", {})
    analytics_env.update(SPARK_MASTER="spark://127.0.0.1:9", SPARK_DRIVER_MEMORY="512m", SPARK_LOCAL_IP="127.0.0.1")
    cluster.start("web", "relay", "credits", "analytics")
    runs = NightlyRun.objects.filter(date=NIGHTLY_DAY)
    with orders_flowing(cluster, make_user) as ledger:
        lock_free = []
        restarts = [
            restart_mid_nightly_run(
                cluster,
                NIGHTLY_DAY,
                spark_master_after="local[1]",
                while_stopped=lambda: lock_free.append(day_lock_is_free()),
            )
        ]
    interrupted = runs.order_by("id").first()
    assert interrupted.status == NightlyRun.Status.INTERRUPTED, interrupted.error

    wait_for(
        lambda: runs.filter(status=NightlyRun.Status.SUCCEEDED).exists(),
        timeout=600,
        what="the requeued run to succeed",
        details=lambda: cluster.logs("analytics"),
    )
    report(summary, ledger, restarts)
    assert_all_well(cluster, ledger, restarts, "analytics")
    assert list(runs.order_by("id").values_list("status", flat=True)) == ["interrupted", "succeeded"]
    assert lock_free == [True], "the interrupted run still held its day's lock after its worker exited"


def day_lock_is_free() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT IS_FREE_LOCK(%s)", [lock_name(date.fromisoformat(NIGHTLY_DAY))])
        return cursor.fetchone()[0] == 1
