"""gunicorn.conf.py: its master preloads third-party modules only, so a HUP still reloads the application's code;
idle keep-alive connections outlast a client's pause."""

import http.client
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings

from testkit.processes import free_port, service_env

pytestmark = pytest.mark.slow

OWN_PACKAGES = ("config", "core", "orders", "outbox", "credits", "analytics")

# Run the file as gunicorn's master does (exec, no Django settings configured), then list what it imported.
PROBE = """
import json, runpy, sys
runpy.run_path("gunicorn.conf.py")
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""


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
    web = subprocess.Popen(
        [str(Path(sys.executable).parent / "gunicorn"), "config.wsgi", f"--bind=127.0.0.1:{port}", "--workers=1",
         "--threads=2", "--worker-class=gthread", "--log-level=warning"],
        cwd=settings.BASE_DIR,
        env=service_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                connection.request("GET", "/api/orders/")
                break
            except OSError:
                assert time.monotonic() < deadline, "gunicorn did not start"
                time.sleep(0.2)
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
