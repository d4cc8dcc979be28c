"""Where a command's CPU goes, by kind of process: a test suite's pass, say, on a machine it has to itself.

    python bench/suite_cpu.py [--json FILE] -- .venv/bin/pytest -n 3 -m "not alone and not paired"

Runs the command and samples every process on the host each second (own user + system time from /proc/PID/stat,
which counts every thread), charging what each spent meanwhile to a kind: the Spark JVMs, the shared MariaDB and
RabbitMQ (running before the command started) and the nodes the tests start, the web, Celery, the nightly command's
Python, pytest itself, and so on. A process that lives less than a sampling interval is missed, and one that exits
loses its last interval: the host's busy time from /proc/stat says how much that was ("not sampled"). On two cores, a
command that keeps the host busy for C CPU-seconds cannot take less than C / 2 seconds of wall, whatever the order.
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import host_busy_seconds  # noqa: E402
from bench.proc_stats import command_line, cpu_seconds, stat_name_and_fields  # noqa: E402

SAMPLE_SECONDS = 1.0
# (kind, test on the command name and the command line), the first that matches wins.
KINDS = (
    ("spark jvm", lambda name, line: name == "java"),
    ("mariadb", lambda name, line: name in ("mariadbd", "mysqld")),
    ("rabbitmq", lambda name, line: name in ("beam.smp", "epmd", "erl_child_setup", "inet_gethost")),
    ("redis", lambda name, line: name == "redis-server"),
    ("web (gunicorn)", lambda name, line: "gunicorn" in line),
    ("celery", lambda name, line: "celery" in line),
    ("nightly command (python)", lambda name, line: "run_nightly_reports" in line),
    ("spark python workers", lambda name, line: "pyspark.daemon" in line or "pyspark.worker" in line),
    ("bench scripts", lambda name, line: "bench/" in line),
    ("pytest", lambda name, line: "pytest" in line or "execnet" in line or "exec(eval(" in line),
    ("browser", lambda name, line: "chrom" in name),
    ("other python", lambda name, line: name.startswith("python")),
)


SHARED_KINDS = ("mariadb", "rabbitmq", "redis")
# The kinds no pattern names, whose costliest command lines are listed so a new pattern can be added.
UNNAMED_KINDS = ("other", "other python")
TOP_UNNAMED = 8


def kind_of(name: str, line: str, *, shared: bool) -> str:
    for kind, matches in KINDS:
        if matches(name, line):
            # The machine's own MariaDB and RabbitMQ run before the command; the tests' cluster nodes start within it.
            return f"{kind} ({'shared' if shared else 'started by the command'})" if kind in SHARED_KINDS else kind
    return "other"


def snapshot() -> dict[tuple[int, str], tuple[str, str, float]]:
    """Return, per live process (pid and start time), its command name and line and its CPU seconds so far."""
    seen = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (found := stat_name_and_fields(entry / "stat")) is not None:
            name, fields = found
            seen[(int(entry.name), fields[19])] = (name, command_line(int(entry.name)), cpu_seconds(fields))
    return seen


def measure(command: list[str]) -> tuple[int, dict]:
    """Run the command to its end while sampling; return its exit code and the CPU seconds per kind."""
    before = snapshot()
    busy_before, started = host_busy_seconds(), time.monotonic()
    last: dict[tuple[int, str], tuple[str, str, float]] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(SAMPLE_SECONDS):
            last.update(snapshot())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    code = subprocess.call(command)
    done.set()
    sampler.join()
    last.update(snapshot())
    spent: dict[str, float] = defaultdict(float)
    unnamed: dict[str, float] = defaultdict(float)
    for (pid, start), (name, line, cpu) in last.items():
        first = before.get((pid, start))
        kind = "this sampler" if pid == os.getpid() else kind_of(name, line, shared=first is not None)
        spent[kind] += cpu - (first[2] if first else 0.0)
        if kind in UNNAMED_KINDS:
            unnamed[line[:120] or name] += cpu - (first[2] if first else 0.0)
    busy, wall = host_busy_seconds() - busy_before, time.monotonic() - started
    spent["not sampled (short-lived or last interval)"] = max(0.0, busy - sum(spent.values()))
    top = dict(sorted(unnamed.items(), key=lambda item: -item[1])[:TOP_UNNAMED])
    return code, {"wall_seconds": wall, "host_busy_cpu_seconds": busy, "per_kind": dict(spent), "top_unnamed": top}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to measure after --")
    code, result = measure(command)
    cores = os.cpu_count() or 1
    print(
        f"\nwall {result['wall_seconds']:.0f} s; host busy {result['host_busy_cpu_seconds']:.0f} CPU-s "
        f"(at least {result['host_busy_cpu_seconds'] / cores:.0f} s of wall on {cores} cores); exit {code}"
    )
    for kind, seconds in sorted(result["per_kind"].items(), key=lambda item: -item[1]):
        print(f"  {seconds:8.1f} CPU-s  {seconds / max(result['host_busy_cpu_seconds'], 1e-9):6.1%}  {kind}")
    print("costliest command lines of no named kind:")
    for line, seconds in result["top_unnamed"].items():
        print(f"  {seconds:8.1f} CPU-s  {line}")
    if args.json:
        args.json.write_text(json.dumps({"command": command, "exit_code": code, **result}, indent=2) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
