"""How a transaction's statements reach the server (core/sql_batches.py): one batch on a server that is not a Galera
node, asked once per connection. tests/galera/test_batch_abort.py shows the round trips on a Galera node."""

import MySQLdb
import pytest
from django.db import connection

from core import sql_batches
from orders.services import order_create

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_system_server_is_not_a_galera_node_and_a_connection_asks_once(user):
    connection.ensure_connection()
    driver = connection.connection
    assert not hasattr(driver, sql_batches._GALERA_NODE)
    asked = []
    real_query = driver.query

    def query(statement):
        asked.append(statement)
        return real_query(statement)

    driver.query = query
    order_create(user=user, goods_name="a", total=1)
    order_create(user=user, goods_name="b", total=2)
    assert asked.count("SELECT @@SESSION.wsrep_on") == 1
    assert getattr(driver, sql_batches._GALERA_NODE) is False

    connection.close()  # a new connection may reach another server: it asks again
    connection.ensure_connection()
    assert not hasattr(connection.connection, sql_batches._GALERA_NODE)
    assert sql_batches.galera_node(connection) is False


def test_a_server_without_galera_variables_is_not_a_galera_node():
    connection.ensure_connection()
    driver = connection.connection

    def query(statement):  # what a MySQL server answers: it has no wsrep_on
        raise MySQLdb.OperationalError(1193, "Unknown system variable 'wsrep_on'")

    driver.query = query
    assert sql_batches.galera_node(connection) is False
    connection.close()
