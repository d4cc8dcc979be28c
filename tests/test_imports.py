"""Web and relay processes never load Spark: its JVM gateway and memory belong to the nightly job alone."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

LOAD = """
import os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
import django
django.setup()
import {module}
print(sorted(name for name in sys.modules if name == "pyspark" or name.startswith("pyspark.")))
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "module",
    [
        "config.urls",  # what a web process loads on its first request
        "outbox.management.commands.relay_outbox",
        "outbox.tasks",
        "credits.tasks",
        "analytics.tasks",
    ],
)
def test_web_relay_and_worker_modules_do_not_import_pyspark(module):
    result = subprocess.run(
        [sys.executable, "-c", LOAD.format(module=module)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]"
