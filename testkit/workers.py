"""What keeps parallel test workers (pytest-xdist) apart: names of their own, and a lock for what they share.

Each worker gets its own test databases (pytest-django suffixes their names with the worker id), its own RabbitMQ
vhost and its own cache key prefix in Redis (conftest.py, `worker_services`), and every port it opens comes from
`testkit.processes.free_port`. Tests on fixed ports (the RabbitMQ and Spark clusters) or one JVM (the shared
SparkSession) run on one worker by `xdist_group`; a test that stops a broker stops one of its own
(testkit/rabbitmq_cluster.py, `private_broker`). A test whose bounds are timings measured with at most one other test
beside it holds `SharedServicesLock` exclusively where more would run (`runs_alone`); every other test holds it
shared.
"""

import contextlib
import fcntl
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

# Groups of tests that run on one worker, one after another (pytest-xdist's `xdist_group`, with --dist loadgroup):
# those on the three-node RabbitMQ cluster's fixed ports (scripts/rabbitmq_cluster.sh), and the Spark tests, which
# share one SparkSession (one JVM, warmed once).
RABBITMQ_CLUSTER_GROUP = "rabbitmq-cluster"
SPARK_GROUP = "spark"
# The tests that run the job as operators do, in processes of their own (a JVM each, none shared: the command's tests
# and the analytics bench's), and the standalone cluster's fixed ports: a group of their own, so they run beside the
# shared session's tests, not after them, and one at a time: a run's JVM wants both cores, and several of them beside
# the rest of the first pass starve one another.
SPARK_PROCESSES_GROUP = "spark-processes"
# Tests that start a pytest run of their own: every run stops at its start what any interrupted run left running,
# so one test's run would stop the orphan another test planted for its own run to find.
PYTEST_RUNS_GROUP = "pytest-runs"
# The id pytest-xdist gives a worker process (gw0, gw1, ...); absent in a run without workers.
WORKER_VARIABLE = "PYTEST_XDIST_WORKER"
WORKER_COUNT_VARIABLE = "PYTEST_XDIST_WORKER_COUNT"
# How many workers the tests marked `paired` run on at most, their bounds measured so (scripts/test.sh, second pass).
PAIRED = 2


def worker_id() -> str | None:
    """Return this process's pytest-xdist worker id, or None outside a parallel run."""
    return os.environ.get(WORKER_VARIABLE)


def worker_count() -> int:
    """Return how many pytest-xdist workers this run has (1 outside a parallel run)."""
    return int(os.environ.get(WORKER_COUNT_VARIABLE, "1"))


def runs_alone(marks: Iterable[str], workers: int) -> bool:
    """Whether a test with these marks holds the shared-services lock exclusively throughout, in a run of `workers`:
    an `alone` test always, a `paired` one where more than PAIRED workers would run beside it."""
    names = set(marks)
    return "alone" in names or ("paired" in names and workers > PAIRED)


def worker_vhost(broker_url: str, worker: str) -> str:
    """Return the vhost a worker uses: the run's own vhost (the URL's path) suffixed with the worker id."""
    base = unquote(urlsplit(broker_url.split(";")[0]).path[1:]).strip("/") or "default"
    return f"{base}-{worker}"


def with_vhost(broker_url: str, vhost: str) -> str:
    """Return `broker_url` (one URL or a failover list joined by ';') with every URL naming `vhost`."""
    return ";".join(urlsplit(url)._replace(path=f"/{quote(vhost, safe='')}").geturl() for url in broker_url.split(";"))


class SharedServicesLock:
    """A readers-writer lock across the worker processes of one run, on two files (fcntl.flock).

    Readers take the data lock shared; a writer takes it exclusively. flock favours no one, so a writer waiting behind
    a stream of overlapping readers could wait for the whole run: a writer first holds the turnstile, which every
    reader passes through before it takes the data lock, so readers that arrive after a writer wait behind it.
    """

    def __init__(self, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        self.turnstile_path = directory / "shared-services.turnstile"
        self.data_path = directory / "shared-services.lock"

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        """Hold the lock shared."""
        with self._locked(fcntl.LOCK_SH, hold_turnstile=False):
            yield

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the lock exclusively, while no other worker is inside a test."""
        with self._locked(fcntl.LOCK_EX, hold_turnstile=True):
            yield

    @contextlib.contextmanager
    def _locked(self, mode: int, *, hold_turnstile: bool) -> Iterator[None]:
        with open(self.turnstile_path, "a") as turnstile, open(self.data_path, "a") as data:
            fcntl.flock(turnstile, fcntl.LOCK_EX)
            try:
                fcntl.flock(data, mode)
            finally:
                if not hold_turnstile:
                    fcntl.flock(turnstile, fcntl.LOCK_UN)
            try:
                yield
            finally:
                fcntl.flock(data, fcntl.LOCK_UN)
                fcntl.flock(turnstile, fcntl.LOCK_UN)
