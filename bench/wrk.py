"""Driving POST /api/orders/ with wrk: the script, a run, its report parsed, and gunicorn's CPU per order.

Each run sends `wrk -t2 -c8` keep-alive POSTs that rotate over the given API tokens, a fresh Idempotency-Key on
every request, so the rate limit never refuses and no request replays an earlier order.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, process_tree_cpu_seconds, start_gunicorn

from testkit.processes import stop_processes

CLIENTS = 8
PORT = 18080

# Each request takes the next token of the rotation and a key no other request of any run uses.
WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"goods_name": "bench item", "total": 3}'
local tokens = {%(tokens)s}
local counter = 0
local thread_id = 0
function setup(thread)
  thread_id = thread_id + 1
  thread:set("tid", thread_id)
end
request = function()
  counter = counter + 1
  wrk.headers["Authorization"] = "Token " .. tokens[((counter * 2 + tid) %% #tokens) + 1]
  wrk.headers["Idempotency-Key"] = "%(run)s-" .. tid .. "-" .. counter
  return wrk.format()
end
"""


def run_wrk(tokens: list[str], duration: float) -> str:
    """Run wrk -t2 -c8 for `duration` seconds of POST /api/orders/ on PORT; return its report."""
    if not shutil.which("wrk"):
        sys.exit("wrk is needed: apt-get install wrk")
    # A fresh key prefix per run: a warm-up's keys reused by the measured run would make replays, not orders.
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        quoted = ", ".join(f'"{token}"' for token in tokens)
        script.write(WRK_SCRIPT % {"tokens": quoted, "run": f"r{time.time_ns()}"})
    command = ["wrk", "-t2", f"-c{CLIENTS}", f"-d{duration:.0f}s", "--latency", "-s", script.name]
    command.append(f"http://127.0.0.1:{PORT}/api/orders/")
    try:
        return subprocess.run(command, check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(script.name)


def parse_wrk(output: str, seconds: float) -> dict:
    def latency_ms(label: str) -> float:
        match = re.search(rf"^\s*{label}%\s+([\d.]+)(us|ms|s)\s*$", output, re.M)
        value, unit = float(match.group(1)), match.group(2)
        return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value

    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    errors = re.search(r"Socket errors: (.*)", output)
    return {
        "requests": int(re.search(r"(\d+) requests in", output).group(1)),
        "orders_per_s": float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1)),
        "p50_ms": latency_ms("50"),
        "p99_ms": latency_ms("99"),
        "non_2xx": int(non_2xx.group(1)) if non_2xx else 0,
        "socket_errors": errors.group(1) if errors else "none",
    }


def measure_http(
    tokens: list[str],
    seconds: float,
    workers: int,
    threads: int,
    *,
    floor: bool = False,
    code_dir: Path = ROOT,
    extra_env: dict | None = None,
) -> dict:
    """Drive POST /api/orders/ with wrk; with `floor`, bench/floor.py (an empty view) serves it, not the service.

    Also returns gunicorn's CPU milliseconds per request over the measured run (`cpu_ms_per_order`).
    """
    env = {"DJANGO_SETTINGS_MODULE": "floor", "PYTHONPATH": str(Path(__file__).resolve().parent)} if floor else {}
    env.update(extra_env or {})
    proc = start_gunicorn(PORT, workers=workers, threads=threads, code_dir=code_dir, **env)
    try:
        run_wrk(tokens, 3)  # warm-up
        cpu_before = process_tree_cpu_seconds(proc.pid)
        result = parse_wrk(run_wrk(tokens, seconds), seconds)
        result["cpu_ms_per_order"] = (process_tree_cpu_seconds(proc.pid) - cpu_before) / result["requests"] * 1000
        return result
    finally:
        stop_processes(proc, grace=15)
