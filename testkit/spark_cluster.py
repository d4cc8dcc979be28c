"""A Spark standalone cluster on loopback, started from the installed pyspark: one master, N workers; stopped after.

The daemons run in the foreground (SPARK_NO_DAEMONIZE), each in its own process group, so stopping one stops the
executors it launched; everything started is stopped, even on failure. bench/bench_analytics.py runs the nightly
job on it, and analytics/tests/test_command_processes.py runs it on one worker.
"""

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

from testkit.processes import stop_processes

SPARK_HOME = Path(pyspark.__file__).parent
# Fixed ports on loopback: master, its UI, then a
# (port, UI port) pair per worker from WORKER_PORTS, and the driver's and block manager's for the job.
MASTER_PORT, MASTER_UI, DRIVER_PORT, BLOCK_PORT = 18600, 18601, 18602, 18603
WORKER_PORTS = 18610
REGISTER_SECONDS = 120


@dataclass
class Cluster:
    url: str
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def pids(self) -> list[int]:
        return [process.pid for process in self.processes]

    def job_env(self, *, executor_memory: str) -> dict[str, str]:
        """The environment a job needs to run on this cluster (its driver binds to loopback, on fixed ports)."""
        return {
            "SPARK_MASTER": self.url,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_EXECUTOR_MEMORY": executor_memory,
            "SPARK_CONF": (
                f"spark.driver.host=127.0.0.1,spark.driver.port={DRIVER_PORT},spark.blockManager.port={BLOCK_PORT}"
            ),
        }


def _start(name: str, *args: str, env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), name, *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _stop(process: subprocess.Popen) -> None:
    stop_processes(process, group=True)


def _wait_for_workers(count: int, deadline: float) -> None:
    seen = "no answer"
    while time.monotonic() < deadline:
        body = b""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{MASTER_UI}/json/", timeout=2) as response:  # noqa: S310
                body = response.read()
            alive = json.loads(body).get("aliveworkers", 0)
            if alive >= count:
                return
            seen = f"{alive} alive"
        except OSError as error:
            seen = repr(error)
        # An answer that is not the master's JSON (its UI's HTML page came here once, under load) is not ready yet;
        # named if it lasts.
        except ValueError:
            seen = f"not JSON: {body[:120]!r}"
        time.sleep(0.5)
    raise TimeoutError(f"{count} Spark standalone workers did not register with the master (last answer: {seen})")


@contextmanager
def standalone_cluster(*, workers: int, cores: int, memory: str, work_dir: Path) -> Iterator[Cluster]:
    """Start a master and `workers` workers of `cores` cores and `memory` each; yield the cluster, then stop it."""
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_WORKER_DIR": str(work_dir / "work"),
        "SPARK_NO_DAEMONIZE": "1",
        # The master and the workers only schedule and launch: C1 and the serial collector start them for a fraction
        # of the JIT's and G1's CPU, which the job beside them on the same cores would otherwise wait for.
        "SPARK_DAEMON_JAVA_OPTS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    }
    cluster = Cluster(url=f"spark://127.0.0.1:{MASTER_PORT}")
    try:
        cluster.processes.append(
            _start(
                "org.apache.spark.deploy.master.Master",
                *("--host", "127.0.0.1", "--port", str(MASTER_PORT), "--webui-port", str(MASTER_UI)),
                env=env,
                log=work_dir / "master.log",
            )
        )
        for i in range(workers):
            port = WORKER_PORTS + 2 * i
            cluster.processes.append(
                _start(
                    "org.apache.spark.deploy.worker.Worker",
                    *("--host", "127.0.0.1", "--port", str(port), "--webui-port", str(port + 1)),
                    *("--cores", str(cores), "--memory", memory, cluster.url),
                    env=env,
                    log=work_dir / f"worker-{i}.log",
                )
            )
        _wait_for_workers(workers, time.monotonic() + REGISTER_SECONDS)
        yield cluster
    finally:
        for process in reversed(cluster.processes):
            _stop(process)
