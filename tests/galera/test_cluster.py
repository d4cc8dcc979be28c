"""scripts/mariadb_cluster.sh's cluster and its writer endpoint: one writer at a time, what happens when two nodes
write the same row, and how the endpoint and the primary component follow a node killed, stopped or gone silent."""

import os
import time

import MySQLdb
import pytest

from testkit import leftovers
from testkit.galera_cluster import GALERA_CLUSTER_GROUP, NODES
from testkit.silence import iptables_available

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(GALERA_CLUSTER_GROUP)]

ER_LOCK_DEADLOCK = 1213
ER_UNKNOWN_COM_ERROR = 1047  # what a node outside the primary component answers: "WSREP has not yet prepared node"
SCRATCH = "galera_scratch"


def write_through_endpoint(cluster, value: int) -> str:
    """Insert one row through the endpoint; return the node name that took it."""
    connection = cluster.connect(timeout=2)
    try:
        cursor = connection.cursor()
        cursor.execute(f"INSERT INTO {SCRATCH}.marks (value) VALUES (%s)", [value])
        cursor.execute("SELECT @@wsrep_node_name")
        return cursor.fetchone()[0]
    finally:
        connection.close()


def first_write_after(cluster, value: int, *, timeout: float) -> tuple[str, float]:
    """Retry a write through the endpoint until one commits; return the node that took it and the seconds it took."""
    started = time.monotonic()
    while True:
        try:
            return write_through_endpoint(cluster, value), time.monotonic() - started
        except MySQLdb.Error:
            if time.monotonic() - started > timeout:
                raise
            time.sleep(0.2)


def marks_on(cluster, node: int) -> set[int]:
    connection = cluster.connect(node)
    try:
        cursor = connection.cursor()
        cursor.execute("SET SESSION wsrep_sync_wait = 1")
        cursor.execute(f"SELECT value FROM {SCRATCH}.marks")
        return {value for (value,) in cursor.fetchall()}
    finally:
        connection.close()


def wait_for_primary(cluster, members: set[int], *, timeout: float) -> float:
    started = time.monotonic()
    while cluster.primary_members() != members:
        assert time.monotonic() - started < timeout, cluster.status()
        time.sleep(0.5)
    return time.monotonic() - started


@pytest.fixture(scope="module")
def scratch(galera):
    connection = galera.connect()
    cursor = connection.cursor()
    cursor.execute(f"CREATE DATABASE IF NOT EXISTS {SCRATCH}")
    cursor.execute(f"CREATE TABLE IF NOT EXISTS {SCRATCH}.marks (id BIGINT AUTO_INCREMENT PRIMARY KEY, value INT)")
    cursor.execute(f"CREATE TABLE IF NOT EXISTS {SCRATCH}.counters (id INT PRIMARY KEY, value INT NOT NULL)")
    cursor.execute(f"INSERT IGNORE INTO {SCRATCH}.counters VALUES (1, 0)")
    connection.close()
    return galera


@pytest.fixture
def cluster(scratch):
    scratch.ensure_whole()
    yield scratch
    scratch.ensure_whole()


def test_status_counts_the_primary_component_and_the_endpoint_has_one_writer(cluster):
    assert "primary component: 3 of 3 nodes" in cluster.status()
    writer = cluster.writer()
    names = {write_through_endpoint(cluster, 0) for _ in range(10)}
    assert names == {f"gal{writer}"}


def test_every_node_has_a_tmpdir_of_its_own(cluster):
    """A starting mariadbd deletes every #sql* file in its tmpdir: in a shared /tmp, another server's temporary tables
    and a bootstrap in progress."""
    for node in NODES:
        connection = cluster.connect(node)
        try:
            cursor = connection.cursor()
            cursor.execute("SELECT @@tmpdir")
            assert cursor.fetchone()[0] == str(cluster.directory / f"gal{node}" / "tmp")
        finally:
            connection.close()


def test_start_again_finds_its_own_nodes_and_endpoint_running_and_is_not_refused_by_them(cluster):
    writer = cluster.writer()

    assert cluster.start() == cluster.run("database-url").strip()
    assert cluster.writer() == writer


def test_every_process_of_the_cluster_carries_this_test_processs_mark_for_the_leftovers_guard(cluster):
    """So a cluster a test process left running when it ended is stopped by the next run (testkit/leftovers.py)."""
    pids = {int(cluster.run("pid", str(node))) for node in NODES}
    pids |= {int((cluster.directory / name).read_text()) for name in ("health.pid", "haproxy.pid")}
    marked = {process.pid: process.mark for process in leftovers.marked_processes()}

    assert {pid: marked.get(pid) for pid in pids} == dict.fromkeys(pids, os.environ[leftovers.MARK])


def test_the_nodes_and_the_endpoints_logs_can_be_kept(cluster, tmp_path):
    kept = cluster.keep_logs(tmp_path)

    names = {str(path.relative_to(tmp_path)) for path in kept}
    for node in NODES:
        assert {f"gal{node}/error.log", f"gal{node}/stdout.log"} <= names
        assert "WSREP: Synchronized with group" in (tmp_path / f"gal{node}" / "error.log").read_text()
    assert {"health.log", "haproxy.log", "haproxy.cfg"} <= names


def test_two_nodes_writing_one_row_fail_the_later_commit_with_a_deadlock(cluster):
    first, second = cluster.connect(1), cluster.connect(2)
    try:
        for connection in (first, second):
            connection.cursor().execute("START TRANSACTION")
            connection.cursor().execute(f"UPDATE {SCRATCH}.counters SET value = value + 1 WHERE id = 1")
        second.cursor().execute("COMMIT")
        # The first's write set reaches certification after the second's, which touched the same row: it is
        # refused, and the client sees a deadlock at COMMIT, an error the service already retries or answers 503 to.
        with pytest.raises(MySQLdb.OperationalError) as refused:
            first.cursor().execute("COMMIT")
        assert refused.value.args[0] == ER_LOCK_DEADLOCK
    finally:
        first.close()
        second.close()


def test_a_killed_writer_is_replaced_within_seconds_and_rejoins_caught_up(cluster):
    old = cluster.writer()
    cluster.kill_node(old)
    new_name, took = first_write_after(cluster, 101, timeout=10)
    assert new_name != f"gal{old}" and took < 10
    for value in range(102, 112):
        write_through_endpoint(cluster, value)
    started = time.monotonic()
    cluster.start_node(old)
    assert wait_for_primary(cluster, {1, 2, 3}, timeout=60) + time.monotonic() - started < 60
    # It caught up on what was written without it (IST), and did not take the writes back.
    assert set(range(101, 112)) <= marks_on(cluster, old)
    assert cluster.writer() == int(new_name.removeprefix("gal"))


def test_a_writer_stopped_gracefully_leaves_a_primary_component_of_two(cluster):
    old = cluster.writer()
    cluster.stop_node(old)
    new_name, took = first_write_after(cluster, 201, timeout=10)
    assert new_name != f"gal{old}" and took < 5
    wait_for_primary(cluster, {1, 2, 3} - {old}, timeout=10)


@pytest.mark.skipif(not iptables_available(), reason="needs iptables and the right to change its rules")
def test_a_silent_writer_leaves_the_primary_component_and_the_endpoint_stops_using_it(cluster):
    old = cluster.writer()
    host = cluster.silent_host(old)
    host.silence()
    try:
        new_name, took = first_write_after(cluster, 301, timeout=10)
        assert new_name != f"gal{old}" and took < 10
        wait_for_primary(cluster, {1, 2, 3} - {old}, timeout=15)
    finally:
        host.heal()
    wait_for_primary(cluster, {1, 2, 3}, timeout=60)
    assert 301 in marks_on(cluster, old)


@pytest.mark.skipif(not iptables_available(), reason="needs iptables and the right to change its rules")
def test_two_silent_nodes_stop_every_write_until_an_operator_restores_a_majority(cluster):
    writer = cluster.writer()
    lone = writer
    cut = [node for node in (1, 2, 3) if node != lone]
    hosts = {node: cluster.silent_host(node) for node in cut}
    for host in hosts.values():
        host.silence()
    try:
        time.sleep(8)  # past the failure detector's timeouts: every node is alone now
        # No node has a majority: none takes a write, so no two sides can diverge (no split brain).
        with pytest.raises(MySQLdb.Error):
            write_through_endpoint(cluster, 401)
        lone_connection = cluster.connect(lone)
        try:
            with pytest.raises(MySQLdb.OperationalError) as refused:
                lone_connection.cursor().execute(f"INSERT INTO {SCRATCH}.marks (value) VALUES (402)")
            assert refused.value.args[0] == ER_UNKNOWN_COM_ERROR
        finally:
            lone_connection.close()
        # A second node back is a majority of the last primary component, but Galera does not form a primary one
        # again once every node left it; an operator who knows the third is gone says so (bootstrap-node).
        hosts[cut[0]].heal()
        time.sleep(5)
        assert cluster.primary_members() == set()
        cluster.bootstrap_node(lone)
        node_name, took = first_write_after(cluster, 403, timeout=10)
        assert node_name in {f"gal{lone}", f"gal{cut[0]}"}
    finally:
        for host in hosts.values():
            host.heal()
    wait_for_primary(cluster, {1, 2, 3}, timeout=60)
    assert 403 in marks_on(cluster, cut[1]) and 401 not in marks_on(cluster, cut[1])
