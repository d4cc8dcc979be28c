"""A three-node RabbitMQ cluster for the tests and the soak, driven through scripts/rabbitmq_cluster.sh (the recipe);
and a broker of one node a test may stop, beside the system broker every test worker shares."""

import os
from dataclasses import dataclass, field
from pathlib import Path

from kombu import Connection

from config.celery import task_queues
from core.contract import ANALYTICS_QUEUE, QUEUE_TYPE_QUORUM
from testkit.processes import cluster_script, free_port

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "rabbitmq_cluster.sh"
NODES = (1, 2, 3)


@dataclass
class RabbitCluster:
    """Nodes cs1..cs3 with their data under `directory`; each started, killed and stopped by pid by the script.

    `script_env` sets the script's variables for another shape: one node, other names and ports (`private_broker`).
    """

    directory: Path
    script_env: dict[str, str] = field(default_factory=dict)

    def run(self, *args: str, timeout: float = 300) -> str:
        return cluster_script(SCRIPT, args[0], self.directory, *args[1:], timeout=timeout, env=self.script_env).stdout

    def start(self) -> None:
        self.run("start")

    def stop(self) -> None:
        self.run("stop")

    @property
    def broker_url(self) -> str:
        """The failover URL naming every node, as CELERY_BROKER_URL takes it."""
        return self.run("broker-url").strip()

    def node_url(self, node: int) -> str:
        return self.broker_url.split(";")[node - 1]

    def start_node(self, node: int) -> None:
        self.run("start-node", str(node))

    def kill_node(self, node: int) -> None:
        self.run("kill-node", str(node))

    def stop_node(self, node: int) -> None:
        self.run("stop-node", str(node))

    def await_quorum(self, node: int, *, seconds: int = 120) -> None:
        """Return once stopping `node` leaves every quorum queue a majority of its members online; raise
        RuntimeError if that takes more than `seconds`."""
        self.run("await-quorum", str(node), str(seconds), timeout=seconds + 60)

    def running(self, node: int) -> bool:
        return (
            cluster_script(SCRIPT, "pid", self.directory, str(node), check=False, env=self.script_env).returncode == 0
        )

    def ensure_running(self) -> None:
        """Start any node a test left stopped."""
        for node in NODES:
            if not self.running(node):
                self.start_node(node)

    def leader(self, queue: str) -> int:
        """Return the number of the node leading a quorum queue."""
        name = self.run("leader", queue).strip()
        return int(name.removeprefix("cs").split("@")[0])

    def ctl(self, node: int, *args: str) -> str:
        return self.run("ctl", str(node), *args)

    def queue_messages(self, node: int = 1) -> dict[str, int]:
        """Return every queue's message count (ready and unacknowledged)."""
        return self._queue_counts(node, "messages")

    def queue_consumers(self, node: int = 1) -> dict[str, int]:
        """Return every queue's consumer count."""
        return self._queue_counts(node, "consumers")

    def _queue_counts(self, node: int, column: str) -> dict[str, int]:
        lines = self.ctl(node, "-q", "list_queues", "name", column, "--no-table-headers").splitlines()
        return {name: int(count) for name, count in (line.split() for line in lines if line.strip())}

    def queue_types(self, node: int = 1) -> dict[str, str]:
        lines = self.ctl(node, "-q", "list_queues", "name", "type", "--no-table-headers").splitlines()
        return dict(line.split() for line in lines if line.strip())

    def queues_recreate(self, *, max_retries: int) -> None:
        """Delete the service's queues and declare them again as quorum queues with this retry limit."""
        with Connection(self.broker_url) as conn:
            channel = conn.default_channel
            for queue in task_queues(queue_type=QUEUE_TYPE_QUORUM, max_retries=max_retries):
                if queue.name != ANALYTICS_QUEUE:
                    channel.queue_delete(queue.name)
            for queue in task_queues(queue_type=QUEUE_TYPE_QUORUM, max_retries=max_retries):
                queue(channel).declare()


def private_broker(directory: Path) -> RabbitCluster:
    """Return a broker of one node under `directory` (not started), on free ports and with a node name of this
    process's own: a test may stop it while every other test worker goes on using the system broker."""
    return RabbitCluster(
        directory,
        script_env={
            "RABBITMQ_CLUSTER_SIZE": "1",
            "RABBITMQ_CLUSTER_NAME": f"private{os.getpid()}-",
            # Node 1's ports are BASE + 1: the free ports found here.
            "RABBITMQ_CLUSTER_BASE_PORT": str(free_port() - 1),
            "RABBITMQ_CLUSTER_DIST_BASE_PORT": str(free_port() - 1),
        },
    )
