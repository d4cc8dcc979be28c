"""gunicorn.conf.py: its master preloads third-party modules only, so a HUP still reloads the application's code;
idle keep-alive connections outlast a client's pause; connections opened together spread over the workers."""

import http.client
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings

from testkit.processes import connections_per_worker, free_port, service_env
from testkit.waiting import wait_for

pytestmark = pytest.mark.slow

OWN_PACKAGES = ("config", "core", "orders", "outbox", "credits", "analytics")

# Run the file as gunicorn's master does (exec, no Django settings configured), then list what it imported.
PROBE = """
import json, runpy, sys
runpy.run_path("gunicorn.conf.py")
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""

WORKERS = 4
THREADS = 2


def _start_web(port: int, log_path: Path, *, workers: int = WORKERS) -> subprocess.Popen:
    """Start gunicorn as gunicorn.conf.py sets it up (its worker class), and return once every worker is ready."""
    with open(log_path, "wb") as log:
        web = subprocess.Popen(
            [str(Path(sys.executable).parent / "gunicorn"), "config.wsgi", f"--bind=127.0.0.1:{port}",
             f"--workers={workers}", f"--threads={THREADS}", "--log-level=info"],
            cwd=settings.BASE_DIR,
            env=service_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + 60
    while log_path.read_text().count("Worker ready") < workers:
        assert web.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
        time.sleep(0.2)
    return web


def test_the_master_imports_no_module_of_the_application():
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    completed = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=settings.BASE_DIR, env=env, capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    imported = set(json.loads(completed.stdout.splitlines()[-1]))
    assert {"django", "rest_framework", "celery", "MySQLdb"} <= imported
    assert imported.isdisjoint(OWN_PACKAGES), sorted(imported & set(OWN_PACKAGES))


def test_an_idle_keep_alive_connection_outlasts_a_pause_of_a_few_seconds(tmp_path):
    # gunicorn's own default (2 s) closed such connections just as clients sent on them again (gunicorn.conf.py).
    port = free_port()
    web = _start_web(port, tmp_path / "web.log", workers=1)
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("GET", "/api/orders/")
        first = connection.getresponse()
        first.read()
        sock = connection.sock
        time.sleep(3)
        connection.request("GET", "/api/orders/")
        second = connection.getresponse()
        second.read()
        assert (first.status, second.status) == (401, 401)
        assert connection.sock is sock  # the same connection, not a new one
    finally:
        web.terminate()
        web.wait(timeout=30)


def _status(connection: http.client.HTTPConnection) -> int:
    response = connection.getresponse()
    response.read()
    return response.status


def test_connections_opened_together_spread_over_the_workers_and_more_than_the_threads_are_all_served(tmp_path):
    # A worker takes a connection only while one of its threads is free (gunicorn.conf.py, BalancedThreadWorker). A
    # connection that has sent nothing yet holds a thread (gunicorn waits for its request there), so as many such
    # connections as there are threads in all land exactly two on each worker. With gunicorn's own gthread worker
    # they land where the first worker to run takes them, often all on one.
    port = free_port()
    web = _start_web(port, tmp_path / "web.log")
    clients = [http.client.HTTPConnection("127.0.0.1", port, timeout=10) for _ in range(WORKERS * THREADS + 1)]
    try:
        for client in clients[:-1]:
            client.connect()  # connected, nothing sent
        wait_for(
            lambda: connections_per_worker(port) == [THREADS] * WORKERS,
            what=f"{THREADS} connections on each worker",
            details=lambda: str(connections_per_worker(port)),
        )

        # Every thread is now in hand: one more connection waits in the listen backlog, its request with it, and is
        # served as soon as a thread comes free.
        clients[-1].request("GET", "/healthz")
        for client in clients[:-1]:
            client.request("GET", "/healthz")
        assert [_status(client) for client in clients] == [200] * len(clients)

        # Kept alive, the connections hold no thread: each is served again on the connection it has.
        for client in clients:
            client.request("GET", "/healthz")
        assert [_status(client) for client in clients] == [200] * len(clients)
        assert sum(connections_per_worker(port)) == len(clients)
    finally:
        for client in clients:
            client.close()
        web.terminate()
        web.wait(timeout=30)
    assert web.returncode == 0
