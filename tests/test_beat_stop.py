"""Celery beat stops on SIGTERM however the broker behaves, with its schedule saved.

Beat's publishes wait for the broker's confirm (config/celery.py). Its SIGTERM handler saves the schedule and then says
goodbye to the broker (AMQP Connection.Close), waiting for the answer; a broker that does not answer, or a goodbye read
on a connection whose confirm was being read when the signal came, kept beat waiting for ever (seen once in CI: beat
still running 120 s after SIGTERM). A proxy that withholds the broker's replies reproduces it.
"""

import shelve
import subprocess
import time
from pathlib import Path

import pytest
from django.conf import settings

from core.beat import GOODBYE_SECONDS
from testkit.broker_proxy import BrokerProxy
from testkit.harness import VENV_BIN
from testkit.processes import free_port, service_env
from testkit.waiting import wait_for

SWEEP_SENT = "Sending due task outbox-sweep"
# The stop's bound: the goodbye's deadline (core/beat.py) and beat's exit around it, 0.4-0.6 s idle and about 5 s more
# beside the first pass's other workers (measured), with room for twice that.
EXIT_SLACK_SECONDS = 10
# The goodbye alone, read at the proxy: its deadline and the wake-ups of two threads. A deadline per reply instead of
# one in all would take twice GOODBYE_SECONDS.
GOODBYE_SLACK_SECONDS = GOODBYE_SECONDS / 2


@pytest.fixture(
    params=[None, 2],
    ids=["frozen-between-publishes", "frozen-as-a-publish-goes-out"],
)
def proxy(request):
    """The proxy the test freezes once two publishes went out; or one that freezes itself as the second goes out,
    before its confirm can come back (where a freeze lands when beat's confirms are slow)."""
    proxy = BrokerProxy(free_port(), freeze_at_publish=request.param)
    proxy.up()
    yield proxy
    proxy.thaw()
    proxy.down()


def sweeps_sent(log: Path) -> int:
    return log.read_text(errors="replace").count(SWEEP_SENT)


def sleeping(pid: int) -> bool:
    """Return whether the process's main thread (beat's only one) waits in the kernel rather than runs."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "S"


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
        wait_for(lambda: proxy.publishes >= 2, timeout=60, what="beat to publish two sweeps")
        proxy.freeze()
        # Read at the proxy, not in beat's log: beat logs a sweep before publishing it, and logs nothing more once
        # it waits for a confirm, so the freeze may land after the last line beat will write.
        wait_for(lambda: proxy.unconfirmed() > 0, timeout=60, what="a publish of beat's whose confirm is withheld")
        # It cannot return from that publish; once it sleeps, it sleeps reading the confirm, where SIGTERM hung it.
        wait_for(lambda: sleeping(beat.pid), timeout=60, what="beat to wait for the confirm")
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
    assert took < GOODBYE_SECONDS + EXIT_SLACK_SECONDS
    # From beat's first Close to the end of its connection, as the broker's side saw it: the goodbye's own length,
    # which the bound above, with beat's exit around it, cannot tell from a goodbye twice as long.
    wait_for(lambda: proxy.goodbyes, timeout=5, what="the proxy to see beat's goodbye end")
    assert max(proxy.goodbyes) < GOODBYE_SECONDS + GOODBYE_SLACK_SECONDS, proxy.goodbyes
    # Saved before the goodbye: every sweep beat sent, the one waiting for its confirm too.
    with shelve.open(str(schedule), flag="r") as saved:  # noqa: S301
        assert saved["entries"]["outbox-sweep"].total_run_count == sweeps_sent(log) >= 2
