"""Least privilege, proven with real processes: the relay, the outbox worker and the credits worker each log in with
a user that has privileges on its own service's tables only, the other service's URL names a user that cannot log
in at all, and orders still flow to credits.
"""

import MySQLdb
import pytest
from django.db import connections

from credits.models import OrderCredit
from orders.services import order_create
from testkit.database_users import ProcessUsers
from testkit.harness import Cluster
from testkit.processes import database_address, free_port, service_env
from testkit.queues import purge_queues
from testkit.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ORDERS_PER_PHASE = 20
ACCESS_DENIED = {1044, 1045, 1142}  # to the database, to the server, to the table


def place_orders(user, n: int) -> set[int]:
    return {order_create(user=user, goods_name="least privilege", total=i + 1).order.pk for i in range(n)}


def wait_credited(order_ids: set[int], cluster: Cluster, *, timeout: float = 60) -> None:
    wait_for(
        lambda: OrderCredit.objects.filter(order_id__in=order_ids).count() == len(order_ids),
        timeout=timeout,
        what=f"{len(order_ids)} credits\n{cluster.logs('credits')}\n{cluster.logs('outbox')}\n{cluster.logs('relay')}",
    )


def refused(users: ProcessUsers, process: str, alias: str, sql: str) -> int | None:
    """Run one statement as a process's user on a database; return the MariaDB error code it failed with."""
    host, port = database_address(alias)
    try:
        conn = MySQLdb.connect(
            host=host,
            port=port,
            user=users.user(process),
            password=users.passwords[process],
            database=connections[alias].settings_dict["NAME"],
        )
        try:
            conn.cursor().execute(sql)
        finally:
            conn.close()
    except MySQLdb.OperationalError as exc:
        return exc.args[0]
    return None


@pytest.fixture
def process_users():
    users = ProcessUsers()
    users.create()
    yield users
    users.drop()


def test_each_process_works_with_privileges_on_its_own_database_only(process_users, user, tmp_path):
    # The users really are confined: across the line, and beyond what their own process needs.
    assert refused(process_users, "relay", "credits", "SELECT 1") in ACCESS_DENIED
    assert refused(process_users, "relay", "default", "SELECT COUNT(*) FROM orders") in ACCESS_DENIED
    assert refused(process_users, "relay", "default", "DELETE FROM transaction_log") in ACCESS_DENIED
    assert refused(process_users, "outbox", "default", "CREATE TABLE t (i INT)") in ACCESS_DENIED
    assert refused(process_users, "credits", "default", "SELECT 1") in ACCESS_DENIED
    assert refused(process_users, "credits", "credits", "DELETE FROM order_credits") in ACCESS_DENIED
    assert refused(process_users, "credits", "credits", "SELECT COUNT(*) FROM order_credits") is None

    purge_queues()
    cluster = Cluster(
        service_env=service_env(), workdir=tmp_path, port=free_port(), process_env=process_users.cluster_env()
    )
    try:
        # The outbox worker publishes on each order's wake-up; the credits worker awards.
        cluster.start("credits", "outbox")
        wait_credited(place_orders(user, ORDERS_PER_PHASE), cluster)
        # Then the relay loop alone publishes (the wake-ups wait unread in the outbox queue).
        cluster.kill("outbox")
        cluster.start("relay")
        wait_credited(place_orders(user, ORDERS_PER_PHASE), cluster)
    finally:
        cluster.stop()
        purge_queues()
    logs = {name: cluster.logs(name, tail=10_000) for name in ("credits", "outbox", "relay")}
    assert not [name for name, text in logs.items() if "denied" in text.lower()], logs
    assert cluster.restarts == {}
