"""A private Prometheus server for tests: its own config, data directory and port, started and stopped by pid.

The recipe, with Debian's `prometheus` package, readable as shell:

    prometheus --config.file=DIR/prometheus.yml --storage.tsdb.path=DIR/data --web.listen-address=127.0.0.1:PORT

Its config scrapes the given targets every second and evaluates deploy/prometheus/creditshop.rules.yml every
second, with the scrape job, path and bearer-token authorization of deploy/prometheus/prometheus.yml: only the
intervals and the targets differ from what production runs. With `time_scale` below 1 it loads a copy of the rules
made from the shipped file by `scaled_rules`: the same rules and expressions, every duration in them multiplied, so a
test sees an alert cross its windows in seconds; promtool's unit tests (tests/test_prometheus_rules.py) hold the
shipped durations themselves.
"""

from __future__ import annotations

import contextlib
import re
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

DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
DURATION_UNITS_MS["y"] = 365 * DURATION_UNITS_MS["d"]
DURATION = r"(?:\d+(?:ms|[smhdwy]))+"
# A range or subquery selector: [5m], [1h:1m].
RANGE = re.compile(rf"\[(?P<range>{DURATION})(?::(?P<step>{DURATION})?)?\]")
# A series in seconds (a `_seconds` metric or a recording rule of one) compared with a number: the number is a
# duration too (`creditshop:outbox_lag_seconds:max > 120`). Histogram bounds (le="5.0") are objectives, not windows.
SECONDS_THRESHOLD = re.compile(
    r"(?P<series>[\w:]*_seconds(?::\w+)?)(?P<op>\s*(?:>=|<=|>|<)\s*)(?P<value>\d+(?:\.\d+)?)\b"
)


def duration_ms(text: str) -> int:
    """Return a Prometheus duration ("2m", "1h30m", "500ms") in milliseconds."""
    parts = re.findall(r"(\d+)(ms|[smhdwy])", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a Prometheus duration: {text!r}")
    return sum(int(n) * DURATION_UNITS_MS[u] for n, u in parts)


def scaled_duration(text: str, factor: float) -> str:
    ms = round(duration_ms(text) * factor)
    if ms < 1:
        raise ValueError(f"{text} scaled by {factor} is under a millisecond")
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def scaled_rules(text: str, factor: float) -> dict:
    """Return the rule file `text` with every duration multiplied by `factor`: range and subquery windows, `for:`,
    and the seconds a `_seconds` series is compared with. Names, labels, annotations and the expressions' form stay
    as shipped."""

    def scale_expr(expr: str) -> str:
        expr = RANGE.sub(
            lambda m: (
                "["
                + scaled_duration(m["range"], factor)
                + (":" + scaled_duration(m["step"], factor) if m["step"] else (":" if ":" in m[0] else ""))
                + "]"
            ),
            expr,
        )
        return SECONDS_THRESHOLD.sub(
            lambda m: m["series"] + m["op"] + f"{float(m['value']) * factor:g}",
            expr,
        )

    rules = yaml.safe_load(text)
    for group in rules["groups"]:
        if "interval" in group:
            group["interval"] = scaled_duration(group["interval"], factor)
        for rule in group["rules"]:
            rule["expr"] = scale_expr(rule["expr"])
            if "for" in rule:
                rule["for"] = scaled_duration(rule["for"], factor)
            if "keep_firing_for" in rule:
                rule["keep_firing_for"] = scaled_duration(rule["keep_firing_for"], factor)
    return rules


@dataclass
class PrometheusServer:
    """One prometheus process on 127.0.0.1:`port` scraping `targets` with `token`; its files under `basedir`."""

    port: int
    targets: list[str]
    token: str
    interval_seconds: int = 1
    # Every duration in the rules multiplied by this (scaled_rules); 1 loads the shipped files themselves.
    time_scale: float = 1.0
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
        rules_dir = DEPLOY if self.time_scale == 1 else self.basedir
        config["rule_files"] = [str(rules_dir / name) for name in config["rule_files"]]
        config.pop("alerting", None)
        (job,) = config["scrape_configs"]
        job.update(scheme="http", scrape_timeout=interval, static_configs=[{"targets": self.targets}])
        job["authorization"]["credentials_file"] = str(self.basedir / "token")
        return config

    def start(self) -> None:
        (self.basedir / "token").write_text(self.token)
        config = self.config()
        if self.time_scale != 1:
            for path in map(Path, config["rule_files"]):
                rules = scaled_rules((DEPLOY / path.name).read_text(), self.time_scale)
                path.write_text(yaml.safe_dump(rules, sort_keys=False))
        (self.basedir / "prometheus.yml").write_text(yaml.safe_dump(config))
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
