"""Every database connection has its role's deadlines (core/deadlines.py), on the client and on the server."""

import json
import os
import subprocess
import sys
import time

import pytest
from django.db import connections

from analytics.jdbc import jdbc_source
from core.deadlines import (
    COMMAND,
    INIT_COMMAND_KEY,
    NIGHTLY,
    RELAY,
    ROLES,
    WEB,
    WORKER,
    Deadlines,
    database_settings,
    init_command,
    worker_deadlines_apply,
)


def in_role(role: str):
    """The `default` alias with a role's deadlines for one test, then the settings' own again."""
    connection = connections["default"]
    connection.close()
    database_settings(connection.settings_dict, role)
    yield connection
    connection.close()
    database_settings(connection.settings_dict, COMMAND)


@pytest.fixture
def web_role(transactional_db):
    yield from in_role(WEB)


@pytest.fixture
def worker_role(transactional_db):
    yield from in_role(WORKER)


def test_a_connection_of_the_web_has_its_read_deadlines_and_the_server_its_statement_limit(web_role):
    with web_role.cursor() as cursor:
        cursor.execute("SELECT @@session.max_statement_time, @@session.time_zone")
        limit, time_zone = cursor.fetchone()
    assert limit == pytest.approx(ROLES[WEB].statement)
    assert time_zone == "+00:00"  # the rest of the init command still runs
    params = web_role.get_connection_params()
    assert (params["connect_timeout"], params["read_timeout"], params["write_timeout"]) == (2, 3, 3)


def test_the_server_stops_a_web_statement_past_its_limit_with_an_error_not_a_broken_connection(web_role):
    from django.db import OperationalError

    with pytest.raises(OperationalError) as failure, web_role.cursor() as cursor:
        cursor.execute("SELECT SLEEP(5)")
    assert failure.value.args[0] == 1969  # ER_STATEMENT_TIMEOUT
    with web_role.cursor() as cursor:
        cursor.execute("SELECT 1")


def test_applying_a_role_twice_does_not_stack_its_server_side_limits():
    settings_dict = {"OPTIONS": {"init_command": "SET time_zone='+00:00'"}}
    database_settings(settings_dict, WORKER)
    database_settings(settings_dict, WORKER)
    command = settings_dict["OPTIONS"]["init_command"]
    assert command.count("max_statement_time") == 1 and command.count("idle_transaction_timeout") == 1
    database_settings(settings_dict, WEB)
    assert "idle_transaction_timeout" not in settings_dict["OPTIONS"]["init_command"]
    database_settings(settings_dict, NIGHTLY)
    assert "max_statement_time" not in settings_dict["OPTIONS"]["init_command"]


def test_the_relays_and_workers_connections_have_the_idle_transaction_limit_and_only_theirs(worker_role):
    with worker_role.cursor() as cursor:
        cursor.execute("SELECT @@session.idle_transaction_timeout, @@session.max_statement_time")
        assert cursor.fetchone() == (ROLES[WORKER].read, pytest.approx(ROLES[WORKER].statement))
    assert ROLES[RELAY].idle_transaction == ROLES[RELAY].read
    assert all(ROLES[role].idle_transaction is None for role in (WEB, NIGHTLY, COMMAND))


def test_a_transaction_whose_client_went_quiet_is_ended_and_its_row_locks_with_it(transactional_db):
    """A connection with the idle transaction limit that opened a transaction, locked a row and then sent nothing
    (its process gone, its close lost in a silence) holds the lock only that long; the row is then free, the
    transaction rolled back."""
    import MySQLdb

    limit = Deadlines(connect=2, read=2, write=2, statement=1.5, idle_transaction=2)
    params = connections["default"].get_connection_params()
    base = connections["default"].settings_dict.get(INIT_COMMAND_KEY, params.get("init_command", ""))
    quiet = MySQLdb.connect(**{**params, **limit.options(), "init_command": init_command(base, limit)})
    other = MySQLdb.connect(**params)
    table = "deadline_probe"
    try:
        with other.cursor() as cursor:
            cursor.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, n INT)")
            cursor.execute(f"INSERT INTO {table} VALUES (1, 0)")
            other.commit()
        with quiet.cursor() as cursor:
            cursor.execute("START TRANSACTION")
            cursor.execute(f"UPDATE {table} SET n = n + 1 WHERE id = 1")
        started = time.monotonic()
        with other.cursor() as cursor:
            cursor.execute("SET SESSION innodb_lock_wait_timeout = 10")
            cursor.execute(f"UPDATE {table} SET n = n + 10 WHERE id = 1")
            waited = time.monotonic() - started
            other.commit()
            cursor.execute(f"SELECT n FROM {table} WHERE id = 1")
            assert cursor.fetchone() == (10,)  # the quiet transaction's +1 rolled back
        assert 1.5 < waited < 6, waited
    finally:
        with other.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {table}")
        quiet.close()
        other.close()


class FakeWorker:
    def __init__(self, *queues):
        from config.celery import app

        self.app = type("App", (), {"amqp": type("Amqp", (), {"queues": type("Q", (), {})()})()})()
        self.app.amqp.queues.consume_from = {name: None for name in queues}
        self.real_app = app


@pytest.mark.parametrize(("queues", "role"), [(("credits",), WORKER), (("outbox",), WORKER), (("analytics",), NIGHTLY)])
def test_a_celery_worker_takes_the_deadlines_of_what_it_consumes(queues, role):
    saved = {alias: dict(connections[alias].settings_dict["OPTIONS"]) for alias in connections}
    try:
        worker_deadlines_apply(sender=FakeWorker(*queues))
        assert connections["credits"].settings_dict["OPTIONS"]["read_timeout"] == ROLES[role].read
    finally:
        for alias, options in saved.items():
            connections[alias].settings_dict["OPTIONS"] = options
        for alias in connections:
            database_settings(connections[alias].settings_dict, COMMAND)


def test_spark_reads_with_the_nightly_roles_deadlines():
    options = jdbc_source("default").options()
    assert options["connectTimeout"] == str(ROLES[NIGHTLY].connect * 1000)
    assert options["socketTimeout"] == str(ROLES[NIGHTLY].read * 1000)


def worker_roles_in_a_process(**env: str) -> list:
    """Return the relay's and the workers' deadlines as a process started with `env` over ours reads them."""
    code = (
        "import json; from dataclasses import astuple; from core.deadlines import RELAY, ROLES, WORKER;"
        " print(json.dumps([astuple(ROLES[RELAY]), astuple(ROLES[WORKER])]))"
    )
    environ = {k: v for k, v in os.environ.items() if k != "DATABASE_WORKER_READ_SECONDS"}
    result = subprocess.run([sys.executable, "-c", code], env={**environ, **env}, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_production_gives_the_relay_and_the_workers_20_s_to_read_and_the_server_15():
    assert worker_roles_in_a_process() == [[3, 20, 20, 15.0, None, 20]] * 2


def test_a_test_cluster_can_shorten_the_relay_and_workers_read_deadline_keeping_the_statement_limit_below_it():
    assert worker_roles_in_a_process(DATABASE_WORKER_READ_SECONDS="4") == [[3, 4, 4, 3.0, None, 4]] * 2
