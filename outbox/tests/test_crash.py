"""A relay killed between publish and mark: its rows go out once more after the lease, none is lost."""

import signal
import subprocess
import time
from collections import Counter

import pytest
from django.utils import timezone

from outbox.drain import drain
from outbox.models import TransactionLog
from outbox.publisher import Publisher
from outbox.tests.support import BASE_DIR, PYTHON
from testkit.processes import service_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LEASE_SECONDS = 2.0


def test_sigkill_between_publish_and_mark_gives_exactly_one_duplicate_and_no_loss(make_rows, credits_queue):
    ids = make_rows(15)
    relay = subprocess.Popen(
        [PYTHON, "-m", "outbox.tests.relay_until_killed", "10", str(LEASE_SECONDS)],
        cwd=BASE_DIR,
        env=service_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = relay.stdout.readline()
        assert line.split() == ["PUBLISHED", "10", "0"], line
        relay.send_signal(signal.SIGKILL)
        relay.wait(timeout=10)
    finally:
        if relay.poll() is None:
            relay.kill()
            relay.wait()
        relay.stdout.close()
    assert relay.returncode == -signal.SIGKILL

    # Published, never marked: those rows are still pending, leased to the dead relay; the other 5 are still due.
    first_copies = credits_queue.ids()
    killed = set(first_copies)
    assert len(first_copies) == len(killed) == 10
    rows = {row.id: row for row in TransactionLog.objects.all()}
    assert {rows[tx].status for tx in ids} == {TransactionLog.Status.PENDING}
    assert all(rows[tx].next_attempt_at > timezone.now() for tx in killed)

    time.sleep(LEASE_SECONDS + 0.2)
    publisher = Publisher()
    try:
        assert drain(publisher) == 15
    finally:
        publisher.close()

    seen = Counter(first_copies + credits_queue.ids())
    assert set(seen) == set(ids)  # no loss
    assert {tx for tx, n in seen.items() if n == 2} == killed  # exactly one duplicate of each killed row
    assert max(seen.values()) == 2
    assert TransactionLog.objects.filter(status=TransactionLog.Status.PUBLISHED).count() == 15
