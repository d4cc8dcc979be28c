"""A three-node MariaDB Galera cluster for the tests, driven through scripts/mariadb_cluster.sh (the recipe)."""

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import MySQLdb

from testkit.leftovers import CLUSTER_DIRECTORY_PREFIX
from testkit.processes import cluster_script
from testkit.silence import SilentHost

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "mariadb_cluster.sh"
NODES = (1, 2, 3)
# The cluster's ports are fixed: under pytest-xdist every test using it runs in this one group, on one worker.
GALERA_CLUSTER_GROUP = "galera-cluster"
# What tells why a node or the endpoint failed: each node's server log, its stdout (a crash's stack, a state
# transfer's script), its database install; the health checker's and haproxy's output, and haproxy's config.
NODE_LOGS = ("error.log", "stdout.log", "install.log")
CLUSTER_LOGS = ("health.log", "haproxy.log", "haproxy.cfg")
# Where a test run keeps a cluster's logs when a test using it failed (tests/galera/conftest.py).
KEPT_LOGS = ROOT / ".run" / "galera-logs"


def cluster_directory() -> Path:
    """Return a new directory for a cluster's files that the database's own user can reach (pytest's are private)."""
    directory = Path(tempfile.mkdtemp(prefix=CLUSTER_DIRECTORY_PREFIX))
    directory.chmod(0o755)
    return directory


def root_connection(address: tuple[str, int], database: str, timeout: float, **options) -> MySQLdb.Connection:
    """Return an autocommit root connection to a node (or the endpoint) at `address`, with `timeout` as every
    deadline; `options` go to the driver as they are."""
    host, port = address
    return MySQLdb.connect(
        host=host,
        port=port,
        user="root",
        password="",
        database=database,
        connect_timeout=timeout,
        read_timeout=timeout,
        write_timeout=timeout,
        autocommit=True,
        **options,
    )


@dataclass
class GaleraCluster:
    """Nodes gal1..gal3 and the writer endpoint, their files under `directory`; each node started and signalled by the
    script."""

    directory: Path

    def run(self, *args: str, timeout: float = 300) -> str:
        return cluster_script(SCRIPT, args[0], self.directory, *args[1:], timeout=timeout).stdout

    def start(self) -> str:
        """Start the nodes and the endpoint; return the endpoint's DATABASE_URL."""
        return self.run("start").strip().splitlines()[-1]

    def stop(self) -> None:
        self.run("stop")

    def keep_logs(self, destination: Path) -> list[Path]:
        """Copy the nodes' logs and the endpoint's and health checker's into `destination` (same layout as the
        cluster's directory); return the copies."""
        sources = [self.directory / f"gal{node}" / name for node in NODES for name in NODE_LOGS]
        sources += [self.directory / name for name in CLUSTER_LOGS]
        kept = []
        for source in sources:
            if source.is_file():
                target = destination / source.relative_to(self.directory)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)
                kept.append(target)
        return kept

    @property
    def endpoint(self) -> tuple[str, int]:
        parts = urlsplit(self.run("database-url").strip())
        return parts.hostname, parts.port

    def node_address(self, node: int) -> tuple[str, int]:
        parts = urlsplit(self.run("node-url", str(node)).strip())
        return parts.hostname, parts.port

    def start_node(self, node: int) -> None:
        self.run("start-node", str(node))

    def kill_node(self, node: int) -> None:
        self.run("kill-node", str(node))

    def stop_node(self, node: int) -> None:
        self.run("stop-node", str(node))

    def bootstrap_node(self, node: int) -> None:
        self.run("bootstrap-node", str(node))

    def running(self, node: int) -> bool:
        return cluster_script(SCRIPT, "pid", self.directory, str(node), check=False).returncode == 0

    def writer(self) -> int | None:
        """Return the node the endpoint sends connections to now, or None when no node is healthy."""
        result = cluster_script(SCRIPT, "writer", self.directory, check=False)
        return int(result.stdout) if result.returncode == 0 else None

    def status(self) -> str:
        return self.run("status")

    def silent_host(self, node: int) -> SilentHost:
        """Return the fault that cuts node N off from its peers and its clients (its own loopback address)."""
        return SilentHost(self.node_address(node)[0])

    def connect(self, node: int | None = None, *, database: str = "", timeout: int = 3) -> MySQLdb.Connection:
        """Return a root connection to one node, or through the endpoint (node None), with short deadlines."""
        return root_connection(self.endpoint if node is None else self.node_address(node), database, timeout)

    def node_state(self, node: int) -> dict[str, str]:
        """Return node N's Galera status variables (wsrep_*), or {} when it does not answer."""
        try:
            connection = self.connect(node, timeout=2)
        except MySQLdb.Error:
            return {}
        try:
            cursor = connection.cursor()
            cursor.execute("SHOW GLOBAL STATUS LIKE 'wsrep%%'")
            return dict(cursor.fetchall())
        except MySQLdb.Error:
            return {}
        finally:
            connection.close()

    def views(self) -> dict[int, str]:
        """Return per node its view of the cluster: the component's state UUID, configuration id, size and status, and
        the last transaction it committed. Nodes in one component show the same UUID and id; two components that each
        took writes show two."""
        names = ("cluster_state_uuid", "cluster_conf_id", "cluster_size", "cluster_status", "last_committed")
        views = {}
        for node in NODES:
            state = self.node_state(node)
            views[node] = (
                " ".join(f"{name}={state.get(f'wsrep_{name}', '?')}" for name in names) if state else "no answer"
            )
        return views

    def primary_members(self) -> set[int]:
        """Return the nodes that answer and are Synced members of a primary component."""
        return {node for node, size in self._primary_sizes().items() if size}

    def whole(self) -> bool:
        """Return whether the three nodes are Synced members of one primary component: each counts all three in it.
        Two components that each call themselves primary (a split whose halves both went on) are not whole."""
        return set(self._primary_sizes().values()) == {len(NODES)}

    def _primary_sizes(self) -> dict[int, int]:
        """Return per node the size of the primary component it is a Synced member of (0: none, or no answer)."""
        sizes = {}
        for node in NODES:
            state = self.node_state(node)
            synced_primary = state.get("wsrep_cluster_status") == "Primary" and state.get("wsrep_local_state") == "4"
            sizes[node] = int(state.get("wsrep_cluster_size", 0)) if synced_primary else 0
        return sizes

    def ensure_whole(self, *, timeout: float = 60) -> None:
        """Start any node a test left stopped and wait until all three are Synced members of the primary component
        (a node a test cut off may still be rejoining), so the next test finds the cluster whole."""
        for node in NODES:
            if not self.running(node):
                self.start_node(node)
        deadline = time.monotonic() + timeout
        while not self.whole():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster is not whole after {timeout:.0f}s:\n{self.status()}")
            time.sleep(0.5)
