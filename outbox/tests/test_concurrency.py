"""Several relays on the same rows at once: each row reaches the queue exactly once."""

import subprocess
import threading
from collections import Counter

import pytest
from django.db import connections

from outbox.drain import drain
from outbox.models import TransactionLog
from outbox.publisher import Publisher
from outbox.tests.support import BASE_DIR, PYTHON
from testkit.processes import service_env

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.slow
@pytest.mark.parametrize("relays", [2, 4])
def test_concurrent_relays_publish_each_row_exactly_once(make_rows, credits_queue, relays):
    ids = make_rows(2000)
    start = threading.Barrier(relays)
    published: dict[int, int] = {}
    errors: list[BaseException] = []

    def run(n: int) -> None:
        publisher = Publisher()
        try:
            publisher.connect()
            start.wait()
            published[n] = drain(publisher, batch_size=25)
        except BaseException as exc:  # reported by the test thread below
            errors.append(exc)
        finally:
            publisher.close()
            connections.close_all()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(relays)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert errors == []
    assert sum(published.values()) == 2000
    assert sum(1 for count in published.values() if count) >= 2, published  # they really shared the work
    seen = Counter(credits_queue.ids())
    assert sorted(seen) == ids
    assert set(seen.values()) == {1}
    assert TransactionLog.objects.filter(status=TransactionLog.Status.PUBLISHED).count() == 2000


@pytest.mark.slow
def test_four_relay_processes_publish_each_row_exactly_once(make_rows, credits_queue):
    ids = make_rows(3000)
    procs = [
        subprocess.Popen(
            [PYTHON, "manage.py", "relay_outbox", "--once", "--batch-size", "20"],
            cwd=BASE_DIR,
            env=service_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
            outputs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    counts = [int(out.split()[-1]) for out in outputs]
    assert sum(1 for count in counts if count) >= 2, counts  # they ran at the same time
    assert sum(counts) == 3000
    seen = Counter(credits_queue.ids())
    assert sorted(seen) == ids
    assert set(seen.values()) == {1}
