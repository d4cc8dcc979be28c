"""Workers check their database connections before a task at most once a second per thread (config/celery.py)."""

import threading
import time
from types import SimpleNamespace

from config import celery as celery_config


def task(*, eager: bool = False) -> SimpleNamespace:
    return SimpleNamespace(request=SimpleNamespace(is_eager=eager))


def test_a_worker_thread_checks_its_connections_once_per_interval_and_each_thread_for_itself(monkeypatch):
    checks = []
    monkeypatch.setattr(celery_config, "close_old_connections", lambda: checks.append(threading.get_ident()))
    monkeypatch.setattr(celery_config, "DB_CHECK_INTERVAL_SECONDS", 0.2)
    monkeypatch.setattr(celery_config, "_db_checked", threading.local())

    for _ in range(50):
        celery_config.database_connections_refresh(task=task())
    assert len(checks) == 1

    time.sleep(0.25)
    celery_config.database_connections_refresh(task=task())
    assert len(checks) == 2

    other = threading.Thread(target=celery_config.database_connections_refresh, kwargs={"task": task()})
    other.start()
    other.join()
    assert len(checks) == 3
    assert checks[2] != checks[0]


def test_eager_tasks_leave_the_callers_connections_alone(monkeypatch):
    checks = []
    monkeypatch.setattr(celery_config, "close_old_connections", lambda: checks.append(1))
    monkeypatch.setattr(celery_config, "_db_checked", threading.local())

    celery_config.database_connections_refresh(task=task(eager=True))

    assert checks == []
