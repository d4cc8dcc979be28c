"""Fixtures for the credits tests: database faults and real workers, both cleaned up even when a test fails."""

import pytest

from credits.tests.support import DatabaseFaults, Worker, broker_reset


@pytest.fixture
def db_faults(transactional_db):
    faults = DatabaseFaults()
    faults.install()
    yield faults
    faults.remove()


@pytest.fixture
def start_worker(transactional_db, tmp_path):
    """Return a function starting a real credits worker; every worker started is stopped at teardown."""
    broker_reset()
    started: list[Worker] = []

    def start(name: str = "w1", *, concurrency: int = 1, **env: str) -> Worker:
        worker = Worker(f"credits-test-{name}", tmp_path, concurrency=concurrency, env=env)
        started.append(worker)
        return worker.start()

    yield start
    for worker in started:
        worker.stop()
    broker_reset()
