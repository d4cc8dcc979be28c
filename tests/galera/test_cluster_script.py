"""scripts/mariadb_cluster.sh's start refuses what it did not start: an address and port another process listens on,
a health checker that cannot run, an endpoint whose connections do not reach the writer. Each on ports of its own,
with no cluster running, beside the package's cluster if one runs."""

import os
import shutil
import socket
import sys
import textwrap
from pathlib import Path

import pytest

from testkit.galera_cluster import NODES, SCRIPT, cluster_directory
from testkit.processes import cluster_script

pytestmark = pytest.mark.slow

PORT_VARIABLES = ("BASE_PORT", "GALERA_BASE_PORT", "IST_BASE_PORT", "SST_BASE_PORT", "CHECK_BASE_PORT")


def free_run(count: int) -> int:
    """Return the first of `count` consecutive TCP ports nothing listens on on 127.0.0.1 right now."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        try:
            for port in range(first, first + count):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return first


@pytest.fixture
def script_env(monkeypatch):
    """Give the script ports no cluster of this run or another uses (the addresses keep the run's prefix)."""
    for name in PORT_VARIABLES:
        monkeypatch.setenv(f"GALERA_CLUSTER_{name}", str(free_run(len(NODES)) - 1))
    monkeypatch.setenv("GALERA_CLUSTER_ENDPOINT_PORT", str(free_run(1)))
    monkeypatch.setenv("GALERA_CLUSTER_START_TIMEOUT", "20")
    monkeypatch.setenv("GALERA_CLUSTER_ENDPOINT_TIMEOUT", "4")
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
    assert f"{host}:{port} (gal2's MySQL port) is taken by pid {os.getpid()}: {sys.executable}" in result.stderr
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

    # No node runs: the endpoint sends its connections to a port nothing answers on.
    result = cluster_script(SCRIPT, "start-endpoint", directory, check=False, timeout=120)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "endpoint up" not in result.stdout
    assert "no connection through the endpoint" in result.stderr and "reached its writer gal1" in result.stderr
