"""Workers check their database connections before a task at most once a second per thread, and only they
(core/worker.py): Celery's Django fixup does nothing per task."""

import threading
import time
from types import SimpleNamespace

from celery import signals
from celery.fixups.django import DjangoFixup
from celery.utils.dispatch.signal import _make_id

from config.celery import app as celery_app
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


def fixup_receivers(worker_fixup) -> list[str]:
    """Name the per-task signals the Django fixup's worker part is connected to."""
    keys = {_make_id(worker_fixup.on_task_prerun), _make_id(worker_fixup.on_task_postrun)}
    return [
        name
        for name, signal in (("task_prerun", signals.task_prerun), ("task_postrun", signals.task_postrun))
        if any(lookup_key[0] in keys for lookup_key, _ in signal.receivers)
    ]


class StartingWorker:
    """What the fixup reads of the worker that starts (a signal's sender must be hashable)."""

    app = celery_app


def test_a_starting_worker_takes_the_django_fixups_per_task_handlers_out():
    fixup = next(f for f in celery_app._fixups if isinstance(f, DjangoFixup))
    starting = StartingWorker()
    try:
        # What Celery's fixup does at worker start, alone: it handles every task.
        fixup.on_worker_init(sender=starting)
        assert fixup_receivers(fixup.worker_fixup) == ["task_prerun", "task_postrun"]

        # The worker start as it happens: the fixup's receiver, then core/worker.py's.
        signals.worker_init.send(sender=starting)
        assert fixup_receivers(fixup.worker_fixup) == []
        # Its work at a prefork child's start stays: closing the connections inherited from the parent.
        assert any(
            lookup_key[0] == _make_id(fixup.worker_fixup.on_worker_process_init)
            for lookup_key, _ in signals.worker_process_init.receivers
        )
    finally:
        for signal, handler in (
            (signals.task_prerun, fixup.worker_fixup.on_task_prerun),
            (signals.task_postrun, fixup.worker_fixup.on_task_postrun),
            (signals.worker_process_init, fixup.worker_fixup.on_worker_process_init),
            (signals.beat_embedded_init, fixup.worker_fixup.close_database),
        ):
            signal.disconnect(handler)
        fixup.worker_fixup.worker = None
