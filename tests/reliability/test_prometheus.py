"""The shipped alert rules on a real Prometheus: it scrapes a live gunicorn with the bearer token, the relay stops
while orders keep coming, and OutboxRelayDown goes firing through Prometheus's HTTP API, then resolves.

The scrape and evaluation intervals are 1 s, and the rules are deploy/prometheus/creditshop.rules.yml with every
duration a tenth of the shipped one (TIME_SCALE, testkit/prometheus_server.scaled_rules): the same expressions, so
OutboxRelayDown fires once a row has been due 12 s, nothing was published for 12 s and both held for 6 s, the shipped
2 min, 2 min and 1 min scaled. tests/test_prometheus_rules.py holds the shipped durations themselves with promtool.
"""

import signal
import time

import pytest
from django.db.models import Max
from django.utils import timezone

from accounts.services import api_token_create
from credits.models import OrderCredit
from outbox.models import TransactionLog
from testkit.harness import Cluster
from testkit.load import Ledger, OrderStream
from testkit.processes import free_port, service_env
from testkit.prometheus_server import PrometheusServer
from testkit.reconcile import wait_until_credited
from testkit.waiting import wait_for

pytestmark = pytest.mark.slow

METRICS_TOKEN = "prometheus-test-token"  # noqa: S105
# The rules' durations as loaded: a tenth leaves each window of OutboxRelayDown six evaluations or more (its `for:`,
# 6 s, is the shortest), so a scrape or an evaluation late by a second on a loaded machine does not decide it.
TIME_SCALE = 0.1
# The deadline the test crosses: a row due 12 s, 12 s without a publish, then 6 s of `for:`.
RELAY_DOWN_SECONDS = (120 + 60) * TIME_SCALE
# How much sooner than RELAY_DOWN_SECONDS after the last publish the alert may fire: the scrape before that publish
# may be a second or two older than it, and the window need only leave that scrape out.
SCRAPE_SLACK_SECONDS = 2
# Room for a loaded machine: starting the alert's clocks waits for the relay's exit and a scrape.
ALERT_TIMEOUT_SECONDS = RELAY_DOWN_SECONDS + 60
# Prometheus answers from its last scrape or evaluation, each once a second: asking more often learns nothing.
POLL_SECONDS = 1


def test_the_relay_alert_fires_when_the_relay_stops_and_resolves_when_it_returns(
    transactional_db, user, tmp_path, summary
):
    began = time.monotonic()
    token = api_token_create(user=user)[1]
    cluster = Cluster(
        service_env=service_env(),
        workdir=tmp_path / "cluster",
        port=free_port(),
        extra_env={"METRICS_TOKEN": METRICS_TOKEN},
    )
    prometheus = PrometheusServer(
        port=free_port(), targets=[f"127.0.0.1:{cluster.port}"], token=METRICS_TOKEN, time_scale=TIME_SCALE
    )
    ledger = Ledger()
    # One order a second keeps a row due the whole time the relay is down, all the alert reads.
    orders = OrderStream(cluster.base_url, [token], rate=1, ledger=ledger)
    try:
        cluster.start("web", "relay", "credits")
        prometheus.start()
        # The scrape carries the bearer token: a 401 would leave `up` at 0.
        wait_for(
            lambda: prometheus.query('up{job="creditshop"} == 1'),
            what="the target scraped with its token",
            interval=POLL_SECONDS,
        )
        orders.start()
        wait_for(
            lambda: prometheus.query("outbox_published_total > 0"),
            what="the relay's publishes scraped",
            interval=POLL_SECONDS,
        )
        wait_for(
            lambda: prometheus.query("creditshop_order_to_credit_seconds_count > 0"),
            what="credits measured",
            interval=POLL_SECONDS,
        )
        assert {
            sample["metric"]["dependency"]: sample["value"][1]
            for sample in prometheus.query("creditshop_dependency_up")
        } == {"database": "1", "credits_database": "1", "broker": "1", "cache": "1"}
        assert prometheus.alert_state("OutboxRelayDown") is None

        cluster.kill("relay", signal.SIGTERM)
        stopped = time.monotonic()
        running_for = stopped - began
        placed_before = placed(ledger)
        wait_for(
            lambda: prometheus.alert_state("OutboxRelayDown") == "firing",
            what="OutboxRelayDown firing",
            details=lambda: f"active: {[a['labels']['alertname'] for a in prometheus.alerts()]}",
            timeout=ALERT_TIMEOUT_SECONDS,
            interval=POLL_SECONDS,
        )
        fired_at, fired_in = timezone.now(), time.monotonic() - stopped
        last_published = TransactionLog.objects.aggregate(last=Max("published_at"))["last"]
        assert prometheus.alert_state("OutboxOldestDueRowOld") in ("pending", "firing")
        (alert,) = [a for a in prometheus.alerts() if a["labels"]["alertname"] == "OutboxRelayDown"]
        assert alert["labels"]["severity"] == "critical"
        assert alert["annotations"]["runbook_url"] == "docs/OPERATIONS.md#outboxrelaydown"

        placed_while_down = placed(ledger) - placed_before
        restarted = time.monotonic()
        cluster.start("relay")
        wait_for(
            lambda: prometheus.alert_state("OutboxRelayDown") is None,
            what="OutboxRelayDown resolved",
            interval=POLL_SECONDS,
        )
        resolved_in = time.monotonic() - restarted
        orders.stop()
        order_ids = placed(ledger)
        # The alert read rows that were due: orders placed while the relay was down, credited once it returned.
        assert placed_while_down
        # No sooner than its scaled windows allow after the last publish: they are what Prometheus evaluated.
        silent_for = (fired_at - last_published).total_seconds()
        summary(
            f"\nrelay stopped {running_for:.1f} s into the test (processes and Prometheus started, publishes and"
            f" credits scraped); OutboxRelayDown firing {fired_in:.1f} s after the relay's stop,"
            f" {silent_for:.1f} s after its last publish; resolved {resolved_in:.1f} s after its start;"
            f" {len(order_ids)} orders, {len(placed_while_down)} placed while it was down"
        )
        assert silent_for >= RELAY_DOWN_SECONDS - SCRAPE_SLACK_SECONDS, silent_for
        wait_until_credited(order_ids, timeout=120)
        assert OrderCredit.objects.filter(order_id__in=order_ids).count() == len(order_ids)
    finally:
        orders.stop()
        prometheus.stop()
        cluster.stop()


def placed(ledger: Ledger) -> set[int]:
    with ledger.lock:
        return {order_id for order_id, _ in ledger.acknowledged.values()}
