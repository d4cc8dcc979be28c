"""Celery beat stops on SIGTERM however the broker behaves, with its schedule saved.

Beat's publishes wait for the broker's confirm (config/celery.py). Its SIGTERM handler saves the schedule and then says
goodbye to the broker (AMQP Connection.Close), waiting for the answer; a broker that does not answer, or a goodbye read
on a connection whose confirm was being read when the signal came, kept beat waiting for ever (seen once in CI: beat
still running 120 s after SIGTERM). A proxy that withholds the broker's replies reproduces it.
"""

import shelve
import subprocess
import time

import pytest
from django.conf import settings

from testkit.broker_proxy import BrokerProxy
from testkit.harness import VENV_BIN
from testkit.processes import free_port, service_env
from testkit.restarts import wait_for


@pytest.fixture
def proxy():
    proxy = BrokerProxy(free_port())
    proxy.up()
    yield proxy
    proxy.frozen.clear()
    proxy.down()


def sweeps_sent(log) -> int:
    return log.read_text(errors="replace").count("Sending due task outbox-sweep")


@pytest.mark.slow
def test_beat_stops_on_sigterm_while_the_broker_withholds_its_confirm(proxy, tmp_path):
    schedule, log = tmp_path / "beat-schedule", tmp_path / "beat.log"
    env = service_env(CELERY_BROKER_URL=proxy.url, OUTBOX_SWEEP_SECONDS="1")
    with log.open("w") as out:
        beat = subprocess.Popen(
            [str(VENV_BIN / "celery"), "-A", "config", "beat", "-l", "INFO", "-s", str(schedule)],
            cwd=settings.BASE_DIR,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: sweeps_sent(log) >= 2, timeout=60, what="beat to send two sweeps")
        # The next publish waits for a confirm that does not come.
        proxy.frozen.set()
        sent = sweeps_sent(log)
        wait_for(lambda: sweeps_sent(log) > sent, timeout=10, what="beat to start a publish")
        time.sleep(0.5)
        signalled = time.monotonic()
        beat.terminate()
        try:
            returncode = beat.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("beat still running 30 s after SIGTERM:\n" + log.read_text(errors="replace")[-3000:])
        took = time.monotonic() - signalled
    finally:
        if beat.poll() is None:
            beat.kill()
            beat.wait()

    assert returncode == 0, log.read_text(errors="replace")[-3000:]
    assert took < 15
    # Saved before the goodbye: the sweeps sent are in the file.
    with shelve.open(str(schedule), flag="r") as saved:  # noqa: S301
        assert saved["entries"]["outbox-sweep"].total_run_count >= 2
