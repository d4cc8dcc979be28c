"""The shipped alert rules on a real Prometheus: it scrapes a live gunicorn with the bearer token, the relay stops
while orders keep coming, and OutboxRelayDown goes firing through Prometheus's HTTP API, then resolves.

Only the scrape and evaluation intervals are short (1 s, testkit/prometheus_server.py); the rules, their windows and
their `for:` durations are deploy/prometheus/creditshop.rules.yml as shipped, so the alert takes about three minutes.
"""

import signal

import pytest

from accounts.services import api_token_create
from credits.models import OrderCredit
from testkit.harness import Cluster
from testkit.load import Ledger, OrderStream
from testkit.processes import free_port, service_env
from testkit.prometheus_server import PrometheusServer
from testkit.reconcile import wait_until_credited
from testkit.waiting import wait_for

pytestmark = pytest.mark.slow

METRICS_TOKEN = "prometheus-test-token"  # noqa: S105
# OutboxRelayDown needs a row due for 2 min, 2 min without a publish, then 1 min of `for:`; room for a loaded machine.
ALERT_TIMEOUT_SECONDS = 480
# Prometheus answers from its last scrape or evaluation, each once a second: asking more often learns nothing.
POLL_SECONDS = 1


def test_the_relay_alert_fires_when_the_relay_stops_and_resolves_when_it_returns(transactional_db, user, tmp_path):
    token = api_token_create(user=user)[1]
    cluster = Cluster(
        service_env=service_env(),
        workdir=tmp_path / "cluster",
        port=free_port(),
        extra_env={"METRICS_TOKEN": METRICS_TOKEN},
    )
    prometheus = PrometheusServer(port=free_port(), targets=[f"127.0.0.1:{cluster.port}"], token=METRICS_TOKEN)
    ledger = Ledger()
    orders = OrderStream(cluster.base_url, [token], rate=2, ledger=ledger)
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
        wait_for(
            lambda: prometheus.alert_state("OutboxRelayDown") == "firing",
            what="OutboxRelayDown firing",
            details=lambda: f"active: {[a['labels']['alertname'] for a in prometheus.alerts()]}",
            timeout=ALERT_TIMEOUT_SECONDS,
            interval=POLL_SECONDS,
        )
        assert prometheus.alert_state("OutboxOldestDueRowOld") in ("pending", "firing")
        (alert,) = [a for a in prometheus.alerts() if a["labels"]["alertname"] == "OutboxRelayDown"]
        assert alert["labels"]["severity"] == "critical"
        assert alert["annotations"]["runbook_url"] == "docs/OPERATIONS.md#outboxrelaydown"

        cluster.start("relay")
        wait_for(
            lambda: prometheus.alert_state("OutboxRelayDown") is None,
            what="OutboxRelayDown resolved",
            interval=POLL_SECONDS,
        )
        orders.stop()
        order_ids = {order_id for order_id, _ in ledger.acknowledged.values()}
        assert len(order_ids) > 100
        wait_until_credited(order_ids, timeout=120)
        assert OrderCredit.objects.filter(order_id__in=order_ids).count() == len(order_ids)
    finally:
        orders.stop()
        prometheus.stop()
        cluster.stop()
