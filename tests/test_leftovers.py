"""testkit/leftovers.py: what an interrupted run left running is stopped by the next, what a session's tests left is
stopped at its end, and a run refuses test databases another process is connected to, naming it."""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import MySQLdb
import pytest

from testkit import leftovers
from testkit.galera_cluster import cluster_directory
from testkit.harness import ROOT
from testkit.processes import database_url, server_arguments
from testkit.waiting import wait_for
from testkit.workers import PYTEST_RUNS_GROUP

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(PYTEST_RUNS_GROUP)]


def sleeper(env: dict[str, str], **popen) -> subprocess.Popen:
    return subprocess.Popen(["sleep", "300"], env=env, **popen)


def without_mark() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name != leftovers.MARK}


def stopped(process: subprocess.Popen) -> bool:
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        return False
    return True


def test_the_next_run_stops_what_a_test_process_that_is_gone_left_running_and_nothing_else():
    # A test process that starts a service in a session of its own and ends without stopping it.
    owner = subprocess.run(
        [
            sys.executable,
            "-c",
            "import subprocess; from testkit import leftovers; leftovers.mark_this_process();"
            "print(subprocess.Popen(['sleep', '300'], start_new_session=True, stdout=-3, stderr=-3).pid)",
        ],
        cwd=ROOT,
        env=without_mark(),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    orphan = int(owner.stdout)
    # A service of a test process that still runs (this one), and a process no test run started.
    ours = sleeper(os.environ, start_new_session=True)
    unmarked = sleeper(without_mark(), start_new_session=True)
    try:
        # The next run, from its start.
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q"]
            + ["accounts/tests/test_keys.py"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )

        assert "Stopped processes an earlier test run left running" in run.stdout, run.stdout + run.stderr
        assert f"pid {orphan}: sleep 300" in run.stdout
        wait_for(lambda: not leftovers._running(orphan), what="the orphan to stop", timeout=15)
        assert ours.poll() is None and unmarked.poll() is None
        assert f"pid {orphan}" in leftovers.LOG.read_text()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(orphan, signal.SIGKILL)
        for process in (ours, unmarked):
            process.kill()
            process.wait()


def test_at_its_sessions_end_what_a_test_process_started_in_a_group_of_its_own_is_stopped():
    # Another test process, standing in for this one: its mark and its process group.
    owner = sleeper(without_mark(), process_group=0)
    mark = leftovers.mark_of(owner.pid)
    env = {**without_mark(), leftovers.MARK: mark}
    service = sleeper(env, start_new_session=True)  # a gunicorn a test started and did not stop
    jvm = sleeper(env, process_group=owner.pid)  # in the test process's own group: it ends with it
    try:
        found = leftovers.stop_own(mark, owner.pid)

        assert [process.pid for process in found] == [service.pid]
        assert stopped(service)
        assert jvm.poll() is None
    finally:
        for process in (owner, service, jvm):
            process.kill()
            process.wait()


def mariadbd(directory: Path, env: dict[str, str]) -> subprocess.Popen:
    """Start a mariadbd on a data directory of its own under `directory`, as scripts/mariadb_cluster.sh starts a node:
    in a session of its own, its config named by --defaults-file; no network, so it is in no one's way. Return it once
    it takes connections on its socket."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "my.cnf").write_text(
        "[mysqld]\n"
        f"datadir={directory / 'data'}\ntmpdir={directory}\nsocket={directory / 'mysqld.sock'}\n"
        f"log-error={directory / 'error.log'}\n"
        "skip-networking\nskip-grant-tables\ninnodb-buffer-pool-size=8M\ninnodb-log-file-size=4M\n"
        + ("user=mysql\n" if os.getuid() == 0 else "")
    )
    (directory / "data").mkdir()
    if os.getuid() == 0:
        shutil.chown(directory, "mysql")
        shutil.chown(directory / "data", "mysql")
    process = subprocess.Popen(
        ["mariadbd", f"--defaults-file={directory / 'my.cnf'}"],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(lambda: (directory / "mysqld.sock").exists() or process.poll() is not None, what="mariadbd", timeout=30)
    assert process.poll() is None, (directory / "error.log").read_text()
    return process


def test_a_cluster_node_a_gone_test_process_left_is_stopped_and_the_machines_own_server_is_not():
    gone = sleeper(without_mark())
    mark = leftovers.mark_of(gone.pid)
    gone.kill()
    gone.wait()
    env = {**without_mark(), leftovers.MARK: mark}
    cluster = cluster_directory()
    machine = Path(tempfile.mkdtemp(prefix="machine-mysql-"))
    machine.chmod(0o755)
    # A node of a cluster that test process started, and the machine's server a test of it restarted: both marked.
    node = mariadbd(cluster / "gal1", env)
    server = mariadbd(machine, env)
    try:
        found = {process.pid for process in leftovers.stop_orphans()}

        assert node.pid in found and server.pid not in found
        assert stopped(node)
        assert server.poll() is None
    finally:
        for process in (node, server):
            process.kill()
            process.wait()
        shutil.rmtree(cluster, ignore_errors=True)
        shutil.rmtree(machine, ignore_errors=True)


@pytest.fixture
def scratch_database():
    """The name of a database no test run uses, on the orders database's server."""
    name = f"cs_leftovers_{uuid.uuid4().hex[:8]}"
    server = MySQLdb.connect(**server_arguments())
    server.cursor().execute(f"CREATE DATABASE {name}")
    try:
        yield name
    finally:
        server.cursor().execute(f"DROP DATABASE IF EXISTS {name}")
        server.close()


def holder(name: str) -> subprocess.Popen:
    """Start a process that connects to database `name` and keeps the connection."""
    code = (
        f"import sys, time, MySQLdb; held = MySQLdb.connect(**{server_arguments()!r}, database=sys.argv[1]);"
        "print('connected', flush=True); time.sleep(300)"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code, name], env=without_mark(), stdout=subprocess.PIPE, text=True
    )
    assert process.stdout.readline().strip() == "connected"
    return process


def test_a_connection_to_the_databases_is_named_with_its_process(scratch_database):
    name = scratch_database
    assert leftovers.foreign_connections("default", [name]) == []

    process = holder(name)
    try:
        found = leftovers.foreign_connections("default", [name])

        assert len(found) == 1
        assert f"to {name}" in found[0] and f"pid {process.pid}:" in found[0] and "MySQLdb.connect" in found[0]
    finally:
        process.kill()
        process.wait()


def test_a_run_refuses_test_databases_another_process_is_connected_to(scratch_database):
    """The run stops before its first test, naming the process, instead of failing tests on data it never wrote."""
    name = scratch_database
    # The run's orders database is test_<name>: the scratch database's own test database, made here and held.
    test_name = f"test_{name}"
    server = MySQLdb.connect(**server_arguments())
    server.cursor().execute(f"CREATE DATABASE {test_name}")
    process = holder(test_name)
    try:
        env = {
            **without_mark(),
            "DATABASE_URL": database_url(name=name),
            "CREDITS_DATABASE_URL": database_url(name=f"{name}_credits"),
        }
        started = time.monotonic()
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--create-db", "-q", "-n", "0"]
            + ["accounts/tests/test_tokens.py"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        output = run.stdout + run.stderr

        assert run.returncode == 3, output
        assert f"Another process is connected to the test database {test_name}" in output
        assert f"pid {process.pid}:" in output
        assert " passed" not in output and time.monotonic() - started < 120
    finally:
        process.kill()
        process.wait()
        server.cursor().execute(f"DROP DATABASE IF EXISTS {test_name}")
        server.close()
