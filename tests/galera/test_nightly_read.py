"""The nightly job on the cluster, reading both services' databases from a node that is not the writer.

ANALYTICS_ORDERS_READ_URL and ANALYTICS_CREDITS_READ_URL name one node itself, with a user that may only SELECT; the
report tables go to the order service's database through the endpoint. Every node counts its clients' statements per
user (MariaDB's userstat): the reader's reads reach that node and no other.
"""

import json
import secrets
import subprocess
import sys
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connections
from django.utils import timezone

from analytics.models import NightlyRun
from demo.seed import seed_demo_data
from orders.models import Order
from testkit.galera_cluster import GALERA_CLUSTER_GROUP, NODES, GaleraCluster
from testkit.processes import mysql_url, service_env
from tests.galera.support import other_node

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.xdist_group(GALERA_CLUSTER_GROUP)]

READER = "cs_nightly_reader"


def statements_by(cluster: GaleraCluster, node: int, user: str) -> tuple[int, int]:
    """Return how many SELECTs and other statements `user`'s clients sent to `node` while userstat counted."""
    connection = cluster.connect(node)
    try:
        cursor = connection.cursor()
        cursor.execute(
            "SELECT SELECT_COMMANDS, UPDATE_COMMANDS + OTHER_COMMANDS FROM information_schema.USER_STATISTICS"
            " WHERE USER = %s",
            [user],
        )
        row = cursor.fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)
    finally:
        connection.close()


@pytest.fixture
def reader(on_galera):
    """A user that may only read both services' databases, and every node counting statements per user."""
    password = secrets.token_hex(12)
    names = [connections[alias].settings_dict["NAME"] for alias in ("default", "credits")]
    connection = on_galera.connect()
    cursor = connection.cursor()
    cursor.execute("CREATE USER IF NOT EXISTS %s@'%%' IDENTIFIED BY %s", [READER, password])
    for name in names:
        cursor.execute(f"GRANT SELECT ON `{name}`.* TO %s@'%%'", [READER])
    connection.close()
    for node in NODES:
        node_connection = on_galera.connect(node)
        node_connection.cursor().execute("FLUSH USER_STATISTICS")
        node_connection.cursor().execute("SET GLOBAL userstat = ON")
        node_connection.close()
    try:
        yield password
    finally:
        for node in NODES:
            node_connection = on_galera.connect(node)
            node_connection.cursor().execute("SET GLOBAL userstat = OFF")
            node_connection.close()
        connection = on_galera.connect()
        connection.cursor().execute("DROP USER IF EXISTS %s@'%%'", [READER])
        connection.close()


def test_the_nightly_job_reads_from_a_node_that_is_not_the_writer(on_galera, reader, tmp_path):
    # A day of its own, weeks back: the package's other tests place today's orders on the same databases.
    day = timezone.now().date() - timedelta(days=30)
    seed_demo_data(orders=300, days=1, users=10, end=day, seed=36)
    placed = Order.objects.filter(created_at__date=day).count()
    node = other_node(on_galera)
    host, port = on_galera.node_address(node)
    read_urls = {
        variable: mysql_url(
            host=host, port=port, name=connections[alias].settings_dict["NAME"], user=READER, password=reader
        )
        for alias, variable in (("default", "ANALYTICS_ORDERS_READ_URL"), ("credits", "ANALYTICS_CREDITS_READ_URL"))
    }
    env = service_env(
        **read_urls,
        DATABASE_WSREP_SYNC_WAIT="1",
        REPORTS_DIR=str(tmp_path / "reports"),
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
    )
    completed = subprocess.run(
        [sys.executable, str(settings.BASE_DIR / "manage.py"), "run_nightly_reports", "--date", str(day)],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr[-3000:]
    analytics = json.loads((tmp_path / "reports" / str(day) / "analytics.json").read_text())
    consistency = json.loads((tmp_path / "reports" / str(day) / "consistency.json").read_text())
    assert analytics["orders"] == placed == 300
    assert consistency["ok"] is True, consistency
    # The run's record went to the writer through the endpoint: the reader may not write.
    run = NightlyRun.objects.get(date=day)
    assert (run.status, run.orders) == ("succeeded", placed)
    selects, others = statements_by(on_galera, node, READER)
    assert selects > 0, (selects, others)
    for elsewhere in set(NODES) - {node}:
        assert statements_by(on_galera, elsewhere, READER) == (0, 0), elsewhere
