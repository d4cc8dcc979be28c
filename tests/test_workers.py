"""Parallel test workers stay apart: each its own vhost and cache prefix, and the shared-services lock is exclusive."""

import subprocess
import sys
import time

import pytest
from django.conf import settings
from django.core.cache import cache
from kombu import Connection

from config.celery import app
from testkit.harness import ROOT
from testkit.processes import service_env
from testkit.workers import PAIRED, SharedServicesLock, runs_alone, with_vhost, worker_id, worker_vhost


def test_a_worker_vhost_is_the_runs_own_suffixed_with_the_worker_id():
    assert worker_vhost("amqp://guest:guest@127.0.0.1:5672/xdist", "gw1") == "xdist-gw1"
    assert worker_vhost("amqp://guest:guest@127.0.0.1:5672//", "gw0") == "default-gw0"


def test_every_url_of_a_failover_list_names_the_vhost():
    urls = "amqp://a:b@127.0.0.1:5701/x;amqp://a:b@127.0.0.1:5702/x"
    assert with_vhost(urls, "x-gw2") == "amqp://a:b@127.0.0.1:5701/x-gw2;amqp://a:b@127.0.0.1:5702/x-gw2"


@pytest.mark.skipif(worker_id() is None, reason="only a parallel run has workers")
def test_this_worker_publishes_and_caches_under_its_own_names():
    worker = worker_id()
    assert settings.CELERY_BROKER_URL.endswith(f"-{worker}")
    assert service_env()["CELERY_BROKER_URL"] == settings.CELERY_BROKER_URL
    with app.connection_for_write() as conn, Connection(settings.CELERY_BROKER_URL) as own:
        assert conn.as_uri(include_password=False) == own.as_uri(include_password=False)
        conn.ensure_connection(max_retries=1)
    assert service_env()["CACHE_KEY_PREFIX"].endswith(f"-{worker}")
    assert cache.make_key("k").startswith("test-")  # and each test its own prefix within it (conftest.py)


# A reader in another process: takes the lock shared, says so on stdout, holds it for the given seconds.
READER = """
import sys, time
from pathlib import Path
from testkit.workers import SharedServicesLock
with SharedServicesLock(Path(sys.argv[1])).shared():
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def reader(directory, seconds: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", READER, str(directory), str(seconds)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )


def test_an_alone_test_runs_alone_and_a_paired_one_beside_one_other_at_most():
    assert runs_alone(["slow", "alone"], 2) and runs_alone(["alone"], 1)
    assert not runs_alone(["slow", "paired"], PAIRED) and runs_alone(["slow", "paired"], PAIRED + 1)
    assert not runs_alone(["slow"], 4)


def test_the_exclusive_lock_waits_for_a_shared_holder_and_holds_new_readers_back(tmp_path):
    lock = SharedServicesLock(tmp_path)
    early = reader(tmp_path, 1.0)
    try:
        assert early.stdout.readline() == "held\n"
        began = time.monotonic()
        with lock.exclusive():
            waited = time.monotonic() - began
            late = reader(tmp_path, 0)
            time.sleep(0.5)
            assert late.poll() is None  # a reader arriving now waits behind the writer
        assert late.stdout.readline() == "held\n"
        assert late.wait(30) == 0
    finally:
        early.wait(30)
    assert waited >= 0.5
