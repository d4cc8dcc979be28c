"""A private Prometheus server for tests: its own config, data directory and port, started and stopped by pid.

The recipe, with Debian's `prometheus` package, readable as shell:

    prometheus --config.file=DIR/prometheus.yml --storage.tsdb.path=DIR/data --web.listen-address=127.0.0.1:PORT

Its config scrapes the given targets every second and evaluates deploy/prometheus/creditshop.rules.yml every
second, with the scrape job, path and bearer-token authorization of deploy/prometheus/prometheus.yml: only the
intervals and the targets differ from what production runs, never the rules.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests
import yaml

from testkit.processes import stop_processes

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy" / "prometheus"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
START_TIMEOUT_SECONDS = 60.0


@dataclass
class PrometheusServer:
    """One prometheus process on 127.0.0.1:`port` scraping `targets` with `token`; its files under `basedir`."""

    port: int
    targets: list[str]
    token: str
    interval_seconds: int = 1
    basedir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="creditshop-prometheus-")))
    process: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict:
        """Return deploy/prometheus/prometheus.yml with this server's targets, token file and short intervals."""
        config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
        interval = f"{self.interval_seconds}s"
        config["global"] = {"scrape_interval": interval, "evaluation_interval": interval}
        config["rule_files"] = [str(DEPLOY / name) for name in config["rule_files"]]
        config.pop("alerting", None)
        (job,) = config["scrape_configs"]
        job.update(scheme="http", scrape_timeout=interval, static_configs=[{"targets": self.targets}])
        job["authorization"]["credentials_file"] = str(self.basedir / "token")
        return config

    def start(self) -> None:
        (self.basedir / "token").write_text(self.token)
        (self.basedir / "prometheus.yml").write_text(yaml.safe_dump(self.config()))
        with open(self.basedir / "prometheus.log", "ab") as log:
            self.process = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={self.basedir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={self.basedir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.process.returncode}: {self.log()}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{self.base_url}/-/ready", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"prometheus was not ready within {START_TIMEOUT_SECONDS:.0f} s: {self.log()}")

    def query(self, expression: str) -> list[dict]:
        """Return the result vector of an instant query."""
        response = requests.get(f"{self.base_url}/api/v1/query", params={"query": expression}, timeout=10)
        response.raise_for_status()
        return response.json()["data"]["result"]

    def alerts(self) -> list[dict]:
        """Return the alerts pending or firing now, as the HTTP API lists them."""
        response = requests.get(f"{self.base_url}/api/v1/alerts", timeout=10)
        response.raise_for_status()
        return response.json()["data"]["alerts"]

    def alert_state(self, name: str) -> str | None:
        """Return "pending" or "firing" for an active alert of that name, None when it is not active."""
        states = {alert["state"] for alert in self.alerts() if alert["labels"]["alertname"] == name}
        return "firing" if "firing" in states else next(iter(states), None)

    def log(self, tail: int = 20) -> str:
        path = self.basedir / "prometheus.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-tail:]) if path.exists() else ""

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 20 s) and remove its files."""
        if self.process is not None:
            stop_processes(self.process)
        shutil.rmtree(self.basedir, ignore_errors=True)
