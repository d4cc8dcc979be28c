"""scripts/mariadb_cluster.sh's start refuses what it did not start: an address and port another process listens on,
a health checker that cannot run, an endpoint whose connections do not reach the writer; and a failed test of the
package keeps the cluster's logs. Each on ports of its own, beside the package's cluster if one runs."""

import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import MySQLdb
import pytest

from testkit.galera_cluster import KEPT_LOGS, NODES, SCRIPT, cluster_directory
from testkit.harness import ROOT
from testkit.processes import (
    DATABASE_URL_VARIABLES,
    cluster_script,
    database_url,
    free_port,
    free_ports,
    server_arguments,
)
from testkit.workers import PYTEST_RUNS_GROUP

pytestmark = pytest.mark.slow

PORT_VARIABLES = ("BASE_PORT", "GALERA_BASE_PORT", "IST_BASE_PORT", "SST_BASE_PORT", "CHECK_BASE_PORT")
# The package's cluster has its nodes on 127.0.3.N, and its tests cut a node off by that address (SilentHost drops
# every packet to and from it): a cluster here on the same addresses would be cut off with it and lose its primary
# component mid-test.
ADDRESS_PREFIX = "127.0.4"


@pytest.fixture
def script_env(monkeypatch):
    """Give the script addresses the package's cluster does not use and ports no cluster of this run or another
    uses."""
    monkeypatch.setenv("GALERA_CLUSTER_ADDRESS_PREFIX", ADDRESS_PREFIX)
    for name in PORT_VARIABLES:
        monkeypatch.setenv(f"GALERA_CLUSTER_{name}", str(free_ports(len(NODES)) - 1))
    monkeypatch.setenv("GALERA_CLUSTER_ENDPOINT_PORT", str(free_port()))
    monkeypatch.setenv("GALERA_CLUSTER_START_TIMEOUT", "60")
    return os.environ


@pytest.fixture
def directory(script_env):
    directory = cluster_directory()
    yield directory
    # Without the checks under test, the script starts what it should have refused: stop it.
    cluster_script(SCRIPT, "stop", directory, check=False, timeout=120)
    shutil.rmtree(directory, ignore_errors=True)


def node_address(directory: Path, node: int) -> tuple[str, int]:
    url = cluster_script(SCRIPT, "node-url", directory, str(node)).stdout.strip()
    host, _, port = url.split("@")[1].split("/")[0].rpartition(":")
    return host, int(port)


def nothing_started(directory: Path) -> bool:
    pid_files = [f"gal{node}/{name}" for node in NODES for name in ("mysqld.pid", "launcher.pid")]
    return not any((directory / name).exists() for name in [*pid_files, "health.pid", "haproxy.pid"])


def test_start_refuses_while_another_process_listens_on_its_ports_and_names_it(directory):
    host, port = node_address(directory, 2)
    endpoint_port = int(os.environ["GALERA_CLUSTER_ENDPOINT_PORT"])
    with socket.socket() as node_squatter, socket.socket() as endpoint_squatter:
        node_squatter.bind((host, port))
        node_squatter.listen()
        endpoint_squatter.bind(("0.0.0.0", endpoint_port))  # noqa: S104 - every address, 127.0.0.1 included
        endpoint_squatter.listen()

        result = cluster_script(SCRIPT, "start", directory, check=False, timeout=120)

    assert result.returncode == 1, result.stdout + result.stderr
    command = Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode()[:100]
    assert f"{host}:{port} (gal2's MySQL port) is taken by pid {os.getpid()}: {command}" in result.stderr
    assert f"127.0.0.1:{endpoint_port} (the endpoint) is taken by pid {os.getpid()}" in result.stderr
    assert nothing_started(directory)


def test_start_fails_naming_the_health_checkers_python_when_it_cannot_run(directory, monkeypatch, tmp_path):
    missing = tmp_path / "no-venv" / "bin" / "python"
    monkeypatch.setenv("GALERA_CLUSTER_PYTHON", str(missing))

    result = cluster_script(SCRIPT, "start", directory, check=False, timeout=120)

    assert result.returncode == 1, result.stdout + result.stderr
    assert f"the health checker cannot run: {missing}" in result.stderr
    assert "endpoint up" not in result.stdout
    assert nothing_started(directory)


# A health checker that calls every node healthy without asking it: what the endpoint's own checks cannot tell from a
# real one.
LYING_HEALTH_CHECKER = """
    import sys, threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Healthy(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    for spec in sys.argv[2:]:
        server = ThreadingHTTPServer((sys.argv[1], int(spec.rsplit(":", 1)[1])), Healthy)
        threading.Thread(target=server.serve_forever, daemon=True).start()
    threading.Event().wait()
"""


def test_the_endpoint_is_reported_up_only_once_a_connection_through_it_reaches_the_writer(
    directory, monkeypatch, tmp_path
):
    liar = tmp_path / "liar.py"
    liar.write_text(textwrap.dedent(LYING_HEALTH_CHECKER))
    python = tmp_path / "python"
    # The script's Python, but its health checker replaced by the liar.
    python.write_text(
        "#!/bin/sh\n"
        f'case "$1" in *galera_health.py) shift; exec {sys.executable} {liar} "$@";; esac\n'
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    monkeypatch.setenv("GALERA_CLUSTER_PYTHON", str(python))
    monkeypatch.setenv("GALERA_CLUSTER_ENDPOINT_TIMEOUT", "4")

    # No node runs: the endpoint sends its connections to a port nothing answers on.
    result = cluster_script(SCRIPT, "start-endpoint", directory, check=False, timeout=120)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "endpoint up" not in result.stdout
    assert "no connection through the endpoint" in result.stderr and "reached its writer gal1" in result.stderr


# A test that fails, run in a pytest of its own with the Galera package's conftest (imported by a conftest beside it):
# in its teardown, after the package's cluster stopped, as a test whose cluster would not become whole again does.
FAILING_TEST = """
import pytest

@pytest.fixture
def fails_afterwards(galera):
    yield
    raise AssertionError("failed on purpose")

def test_fails_in_its_teardown(fails_afterwards):
    pass
"""


@pytest.fixture
def own_databases():
    """DATABASE_URL and CREDITS_DATABASE_URL naming databases of their own, for a pytest run inside this one (with
    this run's names it would recreate this run's test databases); its test databases are dropped afterwards."""
    names = {alias: f"creditshop_{alias}_logs_{os.getpid()}" for alias in DATABASE_URL_VARIABLES}
    yield {variable: database_url(alias, name=names[alias]) for alias, variable in DATABASE_URL_VARIABLES.items()}
    server = MySQLdb.connect(**server_arguments())
    try:
        for name in names.values():
            server.cursor().execute(f"DROP DATABASE IF EXISTS `test_{name}`")
    finally:
        server.close()


@pytest.mark.xdist_group(PYTEST_RUNS_GROUP)
def test_a_failed_test_of_the_package_keeps_the_clusters_logs_and_says_where(script_env, own_databases, tmp_path):
    """The one test here that starts a cluster (on ports of its own): the package fixture's teardown finds the
    failure and keeps the logs, and the failed test's report says where."""
    test_file = tmp_path / "test_failing.py"
    test_file.write_text(FAILING_TEST)
    (tmp_path / "conftest.py").write_text("from tests.galera.conftest import *  # noqa: F403\n")
    before = set(KEPT_LOGS.glob("*")) if KEPT_LOGS.exists() else set()
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT)]
        + ["-p", "no:cacheprovider", "--create-db", "-n", "0", str(test_file)],
        cwd=ROOT,
        env={**script_env, **own_databases},
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = run.stdout + run.stderr
    kept = set(KEPT_LOGS.glob("*")) - before
    # When an assertion fails the logs stay where the inner run's output (in the message) says: they tell why.
    assert run.returncode == 1 and "failed on purpose" in output, output
    assert len(kept) == 1, output
    (destination,) = kept
    assert f"kept under {destination} at the end of the session" in output  # in the failed test's report
    assert f"files) are kept under {destination}" in output  # at the end of the session
    for node in NODES:
        assert "WSREP: Synchronized with group" in (destination / f"gal{node}" / "error.log").read_text()
    assert (destination / "health.log").exists() and (destination / "haproxy.log").exists()
    shutil.rmtree(destination, ignore_errors=True)
