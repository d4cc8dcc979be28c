"""gunicorn.conf.py: its master preloads third-party modules only, so a HUP still reloads the application's code."""

import json
import os
import subprocess
import sys

import pytest
from django.conf import settings

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
