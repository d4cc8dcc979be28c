"""A pytest plugin: each test's wall time and the host's CPU meanwhile, one JSON line per test.

    .venv/bin/pytest -p bench.pytest_cpu -m "slow and not alone and not paired"
    python bench/pytest_cpu.py [FILE]     # the costliest tests and modules of a run

Around each test (setup, call and teardown) it reads the host's busy CPU seconds (/proc/stat, every process: the
servers, workers and JVMs the test started and the shared MariaDB and RabbitMQ it used) and appends
{"test", "wall", "cpu"} to TEST_CPU_FILE (default .run/test-cpu.jsonl). Run in one process on a machine that is
otherwise idle, each test's CPU is its own; beside other workers it is theirs too. bench/suite_cpu.py charges a whole
run to kinds of process instead.
"""

import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import host_busy_seconds  # noqa: E402

DEFAULT_FILE = ".run/test-cpu.jsonl"
TOP = 25


def output_path() -> Path:
    return Path(os.environ.get("TEST_CPU_FILE", DEFAULT_FILE))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    busy, started = host_busy_seconds(), time.monotonic()
    yield
    row = {
        "test": item.nodeid,
        "wall": round(time.monotonic() - started, 2),
        "cpu": round(host_busy_seconds() - busy, 2),
    }
    path = output_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(json.dumps(row) + "\n")


def summary(rows: list[dict]) -> list[str]:
    """Return the report's lines: the totals, the costliest modules, then the costliest tests."""
    modules: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for row in rows:
        module = modules[row["test"].split("::")[0]]
        module[0] += row["cpu"]
        module[1] += row["wall"]
        module[2] += 1
    lines = [
        f"{len(rows)} tests: {sum(r['cpu'] for r in rows):.1f} CPU-s, {sum(r['wall'] for r in rows):.1f} s of wall"
    ]
    lines.append("modules (CPU-s, wall s, tests):")
    for name, (cpu, wall, count) in sorted(modules.items(), key=lambda item: -item[1][0])[:TOP]:
        lines.append(f"  {cpu:8.1f} {wall:8.1f} {count:4d}  {name}")
    lines.append("tests (CPU-s, wall s):")
    for row in sorted(rows, key=lambda r: -r["cpu"])[:TOP]:
        lines.append(f"  {row['cpu']:8.1f} {row['wall']:8.1f}  {row['test']}")
    return lines


if __name__ == "__main__":
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else output_path()
    print("\n".join(summary([json.loads(line) for line in source.read_text().splitlines()])))
