"""Workers check their database connections before a task at most once a second per thread (core/worker.py)."""

import threading
import time
from types import SimpleNamespace

from core import worker


def task(*, eager: bool = False) -> SimpleNamespace:
    return SimpleNamespace(request=SimpleNamespace(is_eager=eager))


def test_a_worker_thread_checks_its_connections_once_per_interval_and_each_thread_for_itself(monkeypatch):
    checks = []
    monkeypatch.setattr(worker, "close_old_connections", lambda: checks.append(threading.get_ident()))
    monkeypatch.setattr(worker, "DB_CHECK_INTERVAL_SECONDS", 0.2)
    monkeypatch.setattr(worker, "_db_checked", threading.local())

    for _ in range(50):
        worker.database_connections_refresh(task=task())
    assert len(checks) == 1

    time.sleep(0.25)
    worker.database_connections_refresh(task=task())
    assert len(checks) == 2

    other = threading.Thread(target=worker.database_connections_refresh, kwargs={"task": task()})
    other.start()
    other.join()
    assert len(checks) == 3
    assert checks[2] != checks[0]


def test_eager_tasks_leave_the_callers_connections_alone(monkeypatch):
    checks = []
    monkeypatch.setattr(worker, "close_old_connections", lambda: checks.append(1))
    monkeypatch.setattr(worker, "_db_checked", threading.local())

    worker.database_connections_refresh(task=task(eager=True))

    assert checks == []
