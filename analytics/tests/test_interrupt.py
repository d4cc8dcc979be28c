"""A nightly run stopped by SIGTERM: recorded as interrupted, its lock released, the command exits 75, and the
Celery task hands its message back only when its own worker is stopping."""

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import date

import pytest
from celery.exceptions import Reject
from django.core.management import CommandError, call_command

from analytics import jobs, runs, tasks
from analytics.models import NightlyRun
from analytics.period import Period

DAY = date(2001, 4, 5)


def interrupted_job(**kwargs):
    raise runs.RunInterrupted("signal SIGTERM")


def day_lock_is_free(connection) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT IS_FREE_LOCK(%s)", [runs.lock_name(DAY)])
        return cursor.fetchone()[0] == 1


@pytest.mark.django_db
def test_an_interrupted_run_is_recorded_as_such_and_releases_its_lock(monkeypatch):
    from django.db import connection

    # Fault injection: SIGTERM's exception comes out of the job, as it does from a Spark call.
    monkeypatch.setattr(jobs, "run_stages", interrupted_job)
    with pytest.raises(runs.RunInterrupted):
        runs.nightly_run(period=Period.ending(DAY), repair=False, write=lambda line: None)
    run = NightlyRun.objects.get(date=DAY)
    assert (run.status, run.stage, run.finished_at is not None) == ("interrupted", "", True)
    assert "interrupted by SIGTERM" in run.error
    assert day_lock_is_free(connection)


@pytest.mark.django_db
def test_a_failure_after_the_signal_is_still_an_interruption(monkeypatch):
    def spark_died(**kwargs):
        # The signal reached the whole process group: the flag is set, and Spark's own error surfaces first.
        runs._interrupted.set()
        raise ConnectionRefusedError("py4j gateway gone")

    monkeypatch.setattr(jobs, "run_stages", spark_died)
    with runs.interrupt_on_sigterm(), pytest.raises(ConnectionRefusedError):
        runs.nightly_run(period=Period.ending(DAY), repair=False, write=lambda line: None)
    assert NightlyRun.objects.get(date=DAY).status == "interrupted"


@pytest.mark.django_db
def test_the_command_exits_75_when_interrupted(monkeypatch):
    monkeypatch.setattr(jobs, "run_stages", interrupted_job)
    with pytest.raises(CommandError, match="interrupted") as raised:
        call_command("run_nightly_reports", "--date", str(DAY))
    assert raised.value.returncode == os.EX_TEMPFAIL == 75


def test_sigterm_becomes_run_interrupted_once_and_the_handler_is_restored():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(runs.RunInterrupted), runs.interrupt_on_sigterm():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler's exception ends the wait at once
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_second_sigterm_while_the_run_records_itself_is_ignored():
    with runs.interrupt_on_sigterm():
        with pytest.raises(runs.RunInterrupted):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        os.kill(os.getpid(), signal.SIGTERM)  # would end this process, or raise again, if not ignored
        time.sleep(0.1)


def test_a_sigterm_that_lands_on_another_thread_still_stops_spark_at_once():
    # The main thread blocked where no signal reaches it (a Spark call, here a lock): the watcher, woken by the
    # signal whichever thread took it, calls on_signal at once (the command stops Spark's JVM there).
    spark_stopped = threading.Event()
    other = threading.Thread(target=time.sleep, args=(1,))
    with pytest.raises(runs.RunInterrupted), runs.interrupt_on_sigterm(on_signal=spark_stopped.set):
        other.start()
        signal.pthread_kill(other.ident, signal.SIGTERM)
        assert spark_stopped.wait(timeout=30)
        time.sleep(5)  # the main thread runs Python again: the handler's exception ends the wait at once
    assert runs.interrupted()
    other.join()


def finished(returncode: int, *, stopping: bool):
    """Stand in for run_forwarding_sigterm: the command exited with `returncode`, and the worker was `stopping`."""
    completed = subprocess.CompletedProcess(args=[], returncode=returncode, stdout="", stderr="")
    return lambda *args, **kwargs: (completed, stopping)


def test_the_task_requeues_a_run_its_worker_interrupted(monkeypatch):
    monkeypatch.setattr(tasks, "run_forwarding_sigterm", finished(os.EX_TEMPFAIL, stopping=True))
    with pytest.raises(Reject) as raised:
        tasks.run_nightly(date=str(DAY))
    assert raised.value.requeue is True


def test_a_run_interrupted_by_someone_else_fails_the_task(monkeypatch):
    # The command was signalled on its own (an operator's kill), not through the worker's shutdown: no requeue.
    monkeypatch.setattr(tasks, "run_forwarding_sigterm", finished(os.EX_TEMPFAIL, stopping=False))
    with pytest.raises(tasks.NightlyRunFailed, match="exited 75"):
        tasks.run_nightly.apply(kwargs={"date": str(DAY)}, throw=True)


@pytest.mark.slow
def test_sigterm_is_forwarded_to_the_command_and_reported():
    # The command, once it handles SIGTERM itself, sends this process (its parent) the SIGTERM a worker's shutdown
    # would, and exits 75 when it comes back.
    child = (
        "import os, signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(75)); print('up', flush=True);"
        " os.kill(os.getppid(), signal.SIGTERM); time.sleep(60)"
    )
    before = signal.getsignal(signal.SIGTERM)
    completed, stopping = tasks.run_forwarding_sigterm([sys.executable, "-c", child], timeout=60)
    assert (completed.returncode, completed.stdout, stopping) == (75, "up\n", True)
    assert signal.getsignal(signal.SIGTERM) == before


@pytest.mark.slow
def test_the_worker_shutdown_hook_signals_only_pool_processes_of_marked_tasks(monkeypatch):
    from celery.worker import state

    from core.worker import long_tasks_interrupt

    sleepers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    marked, plain = (type("Task", (), {"interrupt_on_worker_shutdown": flag})() for flag in (True, False))
    requests = {
        type("Request", (), {"worker_pid": p.pid, "task": t})() for p, t in zip(sleepers, (marked, plain), strict=True)
    }
    monkeypatch.setattr(state, "active_requests", requests)
    try:
        long_tasks_interrupt(sig="SIGTERM", how="Warm", exitcode=0)
        assert sleepers[0].wait(timeout=30) == -signal.SIGTERM
        assert sleepers[1].poll() is None
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()


# Run in a process of its own: spark_jvm_stop stops every child of the process that calls it, and this test
# process has others (a second MariaDB server, say).
STOP_CHILDREN_PROBE = """
import subprocess, sys
import django
django.setup()
from analytics.spark import spark_jvm_stop
ignore_sigterm = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True)"
stubborn = subprocess.Popen([sys.executable, "-c", ignore_sigterm + "; time.sleep(60)"], stdout=subprocess.PIPE)
assert stubborn.stdout.readline() == b"up\\n"
print(spark_jvm_stop(grace_seconds=0.5), stubborn.wait(timeout=30))
"""


@pytest.mark.slow
def test_an_interrupted_run_stops_the_jvm_it_started_even_one_that_ignores_sigterm():
    from django.conf import settings

    from testkit.processes import service_env

    completed = subprocess.run(
        [sys.executable, "-c", STOP_CHILDREN_PROBE],
        cwd=settings.BASE_DIR,
        env=service_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    # One child stopped, by SIGKILL once the grace period was over.
    assert completed.stdout.split() == ["1", str(-signal.SIGKILL)]


@pytest.mark.django_db
def test_a_day_lock_is_free_the_moment_its_run_lets_go():
    from django.db import connection

    # The server frees a closed connection's locks on its own time: released by statement, the next run may start
    # at once (20 tries, as a race would show itself only now and then).
    for _ in range(20):
        with runs.run_lock(period=Period.ending(DAY)):
            assert not day_lock_is_free(connection)
        assert day_lock_is_free(connection)
