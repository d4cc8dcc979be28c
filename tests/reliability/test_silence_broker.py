"""The broker goes silent (its packets dropped both ways, no reset) while orders keep coming, then the network heals.

Every process reaches RabbitMQ through a SilentLink (testkit/silence.py). Nothing may exit: the web answers every
order (it never waits on the broker), and within RECOVERY_LIMIT_SECONDS of the heal the relay publishes again, every
worker answers a ping on its control queue (its pidbox) and consumes again, and beat's sweeps arrive; afterwards
nothing is lost, nothing credited twice, nothing dead-lettered. docs/OPERATIONS.md, "When the broker goes silent",
says which deadline finds a silent connection where. For the silence past every deadline the cluster's processes get
config/celery.py's heartbeat, socket timeout and keepalive idle at half production's (BROKER_*_SECONDS in their
environment), and the silence with them; the silence between a worker's deadline and the broker's keeps production's.
"""

import re
import socket
import time
from datetime import datetime, timedelta
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.utils import timezone

from accounts.services import api_token_create
from config.celery import app
from credits.models import OrderCredit
from outbox.models import TransactionLog
from testkit.harness import Cluster
from testkit.load import HealthProbe, Ledger, OrderStream
from testkit.processes import broker_url, free_port, service_env
from testkit.queues import purge_queues
from testkit.reconcile import wait_for_credits, wait_until_published
from testkit.silence import SilentLink, drop_leftover_rules, iptables_available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not iptables_available(), reason="needs iptables and the right to change its rules (root)"),
]

RATE = 10  # orders per second, across all clients
# config/celery.py's deadlines in the cluster: half production's 10 s heartbeat, socket timeout and keepalive idle.
HEARTBEAT_SECONDS = 5
SOCKET_TIMEOUT_SECONDS = 5
KEEPALIVE_IDLE_SECONDS = 5
# py-amqp's TCP_KEEPINTVL: keepalive finds an idle silent connection one probe interval after the idle time.
KEEPALIVE_INTERVAL_SECONDS = 10
# Past every deadline: the broker's (two to three heartbeats), keepalive's, a blocking read's, by 5 s.
LONG_SILENCE_SECONDS = max(3 * HEARTBEAT_SECONDS, KEEPALIVE_IDLE_SECONDS + KEEPALIVE_INTERVAL_SECONDS) + 5
# Past a worker's finding its connection dead (its heartbeat write, a third of a heartbeat apart, unanswered for 1 s),
# short of the broker's giving it up (two heartbeats at least), with production's 10 s heartbeat: the worker's
# reconnection, whose waits do not shrink with the heartbeat, must be done well before the broker lets go. With a
# 5 s heartbeat and a 6 s silence the broker let go while a worker was declaring its control queue again.
SHORT_SILENCE_SECONDS = 12
SHORTENED = ("BROKER_HEARTBEAT_SECONDS", "BROKER_SOCKET_TIMEOUT_SECONDS", "BROKER_KEEPALIVE_IDLE_SECONDS")
WARM_UP_SECONDS = 5
RECOVERY_LIMIT_SECONDS = 15
CATCH_UP_LIMIT_SECONDS = 60
WORKERS = ("credits", "outbox", "analytics")
# Celery's worker log line for a task received, and the relay loop's when the broker answers again.
SWEEP_RECEIVED = re.compile(r"Task outbox\.sweep\[[^\]]+\] received")
RELAY_BACK = re.compile(r"broker unreachable|broker reachable again")
LOG_TIME = re.compile(r"^\[?(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")


@pytest.fixture
def broker_link():
    drop_leftover_rules()
    parts = urlsplit(settings.CELERY_BROKER_URL)
    with SilentLink((parts.hostname or "127.0.0.1", parts.port or 5672)) as link:
        yield link


@pytest.fixture
def silent_cluster(broker_link, process_users, transactional_db, tmp_path):
    """The service's processes, each reaching the broker through `broker_link` only."""
    purge_queues()
    cluster = Cluster(
        service_env=service_env(
            CELERY_BROKER_URL=broker_url(port=broker_link.port),
            BROKER_HEARTBEAT_SECONDS=str(HEARTBEAT_SECONDS),
            BROKER_SOCKET_TIMEOUT_SECONDS=str(SOCKET_TIMEOUT_SECONDS),
            BROKER_KEEPALIVE_IDLE_SECONDS=str(KEEPALIVE_IDLE_SECONDS),
        ),
        workdir=tmp_path,
        port=free_port(),
        process_env=process_users.cluster_env(),
    )
    try:
        yield cluster
    finally:
        cluster.stop()
        purge_queues()


def log_lines_after(cluster: Cluster, name: str, pattern: re.Pattern, since: datetime) -> list[datetime]:
    """Return the times of a process's log lines matching `pattern`, logged at or after `since` (local time)."""
    path = cluster.workdir / "logs" / f"{name}.log"
    found = []
    for line in path.read_text(errors="replace").splitlines() if path.exists() else ():
        stamp = LOG_TIME.match(line)
        if stamp and pattern.search(line):
            at = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f")
            if at >= since:
                found.append(at)
    return found


def watch_recovery(cluster: Cluster, *, healed_at: float, healed_wall: datetime) -> dict[str, float]:
    """Poll until every process worked again or RECOVERY_LIMIT_SECONDS pass; return seconds after the heal for each.

    Workers answer a ping sent straight to the broker (not through the link): the answer proves each worker's
    control queue is consumed on a live connection. The relay's rows published and credits written are read from
    the databases, beat's sweeps from the outbox worker's log.
    """
    host = socket.gethostname()
    healed = timezone.now() - timedelta(seconds=time.monotonic() - healed_at)
    back: dict[str, float] = {}
    deadline = healed_at + RECOVERY_LIMIT_SECONDS + 5
    while time.monotonic() < deadline and len(back) < len(WORKERS) + 3:
        now = time.monotonic() - healed_at
        waiting = [name for name in WORKERS if f"ping:{name}" not in back]
        if waiting:
            replies = app.control.ping(destination=[f"{name}@{host}" for name in waiting], timeout=0.5)
            for reply in replies:
                for node in reply:
                    back.setdefault(f"ping:{node.partition('@')[0]}", now)
        if "relay" not in back and TransactionLog.objects.filter(published_at__gte=healed).exists():
            back["relay"] = now
        if "credits" not in back and OrderCredit.objects.filter(created_at__gte=healed).exists():
            back["credits"] = now
        if "beat" not in back and log_lines_after(cluster, "outbox", SWEEP_RECEIVED, healed_wall):
            back["beat"] = now
        time.sleep(0.25)
    return back


def run_silence(cluster: Cluster, link: SilentLink, make_user, *, silence_seconds: float, summary) -> dict:
    users = [make_user(f"silence{i}") for i in range(4)]
    user_ids = [u.pk for u in users]
    tokens = [api_token_create(user=u)[1] for u in users]
    cluster.start()
    ledger = Ledger()
    stream = OrderStream(cluster.base_url, tokens, rate=RATE, ledger=ledger)
    probe = HealthProbe(cluster.base_url)
    stream.start()
    probe.start()
    try:
        time.sleep(WARM_UP_SECONDS)
        assert wait_for_credits(ledger, user_ids, timeout=30)[0].credited > 0, cluster.logs("credits")
        silent_at = time.monotonic()
        with link.silenced():
            time.sleep(silence_seconds)
        healed_at, healed_wall = time.monotonic(), datetime.now()
        back = watch_recovery(cluster, healed_at=healed_at, healed_wall=healed_wall)
        time.sleep(2)
    finally:
        stream.stop()
        probe.stop()
    result, drained_in = wait_for_credits(ledger, user_ids, timeout=CATCH_UP_LIMIT_SECONDS)
    longest = max((seconds for _, seconds in ledger.latencies), default=float("nan"))
    longest_health = max(seconds for _, seconds, _, _ in probe.answers)
    # The web's own check of the broker has no connection to lose: it answers 503 naming it within its deadline.
    during = [(status, body) for at, _, status, body in probe.answers if silent_at + 3 < at < healed_at]
    alive = {name: proc.poll() is None for name, proc in cluster.procs.items()}
    summary(
        f"\nsilence {silence_seconds:.0f}s; back after the heal (s): "
        f"{ {name: round(seconds, 1) for name, seconds in sorted(back.items())} }\n"
        f"client statuses: {dict(ledger.statuses)}; longest order {longest:.2f}s; longest /healthz"
        f" {longest_health:.2f}s; "
        f"restarted: {dict(cluster.restarts)}; alive: {alive}\n{result}\ndrained in {drained_in:.1f}s"
    )
    logs = "\n".join(f"--- {name}\n{cluster.logs(name, tail=30)}" for name in ("credits", "outbox", "relay", "beat"))
    assert dict(cluster.restarts) == {}, logs
    assert all(alive.values()), alive
    assert ledger.gave_up == 0 and ledger.server_errors == [], ledger.statuses
    assert longest_health < 2.0
    assert during and all(status == 503 and body["checks"]["broker"] != "ok" for status, body in during), during
    expected = {*(f"ping:{name}" for name in WORKERS), "relay", "credits", "beat"}
    late = {name for name in expected if back.get(name, float("inf")) > RECOVERY_LIMIT_SECONDS}
    assert late == set(), f"not working {RECOVERY_LIMIT_SECONDS}s after the heal: {sorted(late)}\n{logs}"
    result.assert_nothing_lost_or_duplicated(logs=logs)
    assert result.dead_letters == 0
    assert wait_until_published(timeout=settings.OUTBOX_LEASE_SECONDS + 30) == 0, "outbox rows never published"
    return back


def test_every_process_works_again_after_a_silence_longer_than_every_deadline(
    silent_cluster, broker_link, make_user, summary
):
    # Longer than every deadline of config/celery.py, the broker's own included (two to three heartbeats): by the heal
    # the broker has let go of every connection the workers had.
    run_silence(silent_cluster, broker_link, make_user, silence_seconds=LONG_SILENCE_SECONDS, summary=summary)


def test_a_worker_reconnecting_before_the_broker_let_go_keeps_running(silent_cluster, broker_link, make_user, summary):
    # Longer than a worker takes to find its connection dead (its heartbeat write unanswered), shorter than the broker
    # takes: the worker reconnects while the broker still holds its old connection, and the old connection's
    # consumer on the worker's control queue (pidbox).
    for name in SHORTENED:
        silent_cluster.service_env.pop(name)
    run_silence(silent_cluster, broker_link, make_user, silence_seconds=SHORT_SILENCE_SECONDS, summary=summary)
