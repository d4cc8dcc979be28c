"""The test proxy that loses or holds a COMMIT (testkit/lost_answer.py), against this run's own MariaDB server.

The Galera tests rely on its three modes meaning what they say: the answer lost after the transaction committed, the
COMMIT lost before it, or the COMMIT held while a hook runs (the transaction still uncommitted then) and delivered
after it.
"""

import uuid

import MySQLdb
import pytest
from django.db import connections

from testkit.lost_answer import ANSWER_LOST, COMMIT_HELD, COMMIT_LOST, LostAnswerProxy
from testkit.processes import database_address

pytestmark = pytest.mark.django_db(transaction=True)


def connect(address: tuple[str, int]) -> MySQLdb.Connection:
    db = connections["default"].settings_dict
    host, port = address
    return MySQLdb.connect(
        host=host,
        port=port,
        user=db["USER"],
        password=db["PASSWORD"],
        database=db["NAME"],
        connect_timeout=3,
        read_timeout=5,
        write_timeout=5,
    )


@pytest.fixture
def table():
    """A scratch table of this test's own in the test database, and a direct connection to read it."""
    name = f"lost_answer_{uuid.uuid4().hex[:8]}"
    direct = connect(database_address())
    direct.autocommit(True)
    direct.cursor().execute(f"CREATE TABLE {name} (id INT PRIMARY KEY)")
    try:
        yield name, direct
    finally:
        direct.cursor().execute(f"DROP TABLE {name}")
        direct.close()


def rows(direct: MySQLdb.Connection, name: str) -> list[int]:
    cursor = direct.cursor()
    cursor.execute(f"SELECT id FROM {name}")
    return [value for (value,) in cursor.fetchall()]


@pytest.fixture
def proxy():
    with LostAnswerProxy(database_address()) as proxy:
        yield proxy


def insert_and_commit(proxy: LostAnswerProxy, name: str) -> None:
    client = connect(("127.0.0.1", proxy.port))
    try:
        cursor = client.cursor()
        cursor.execute("START TRANSACTION")
        cursor.execute(f"INSERT INTO {name} VALUES (1)")
        cursor.execute("COMMIT")
    finally:
        client.close()


def test_a_held_commit_waits_for_the_hook_then_commits_and_is_answered(proxy, table):
    name, direct = table
    seen_by_the_hook = []
    proxy.arm(COMMIT_HELD, lambda: seen_by_the_hook.append(rows(direct, name)))
    insert_and_commit(proxy, name)
    assert proxy.fired.is_set()
    assert seen_by_the_hook == [[]]  # the transaction was still open while the hook ran
    assert rows(direct, name) == [1]
    # Disarmed once fired: the connection and the next transactions go on as usual.
    direct.cursor().execute(f"DELETE FROM {name}")
    insert_and_commit(proxy, name)
    assert rows(direct, name) == [1]


@pytest.mark.parametrize(("mode", "committed"), [(ANSWER_LOST, [1]), (COMMIT_LOST, [])])
def test_a_commit_whose_answer_or_itself_is_lost_leaves_the_client_without_a_connection(proxy, table, mode, committed):
    # Committed or not, the client cannot tell: its connection is gone either way.
    name, direct = table
    proxy.arm(mode)
    with pytest.raises(MySQLdb.OperationalError):
        insert_and_commit(proxy, name)
    assert proxy.fired.is_set()
    assert rows(direct, name) == committed
