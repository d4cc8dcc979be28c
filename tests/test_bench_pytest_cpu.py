"""bench/pytest_cpu.py: each test's wall and the host's CPU meanwhile, and the report of a run's costliest."""

import json
import subprocess
import sys

import pytest

from bench.pytest_cpu import summary
from testkit.harness import ROOT

BURNS = """
import time

def test_burns():
    t = time.process_time()
    while time.process_time() - t < 0.5:
        pass

def test_sleeps():
    time.sleep(0.3)
"""


@pytest.mark.slow
def test_each_test_of_a_run_gets_a_line_with_its_wall_and_the_hosts_cpu(tmp_path):
    (tmp_path / "test_burns.py").write_text(BURNS)
    out = tmp_path / "cpu.jsonl"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "bench.pytest_cpu", "-p", "no:cacheprovider", "-q", "-n", "0"]
        + ["-c", "/dev/null", "--rootdir", str(tmp_path), str(tmp_path / "test_burns.py")],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "TEST_CPU_FILE": str(out)},
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert run.returncode == 0, run.stdout + run.stderr
    rows = {row["test"].split("::")[1]: row for row in map(json.loads, out.read_text().splitlines())}
    assert set(rows) == {"test_burns", "test_sleeps"}
    assert rows["test_burns"]["cpu"] >= 0.4  # the host's busy time covers the test's own
    assert rows["test_sleeps"]["wall"] >= 0.3


def test_the_report_ranks_modules_and_tests_by_cpu():
    rows = [
        {"test": "a.py::one", "wall": 2.0, "cpu": 1.0},
        {"test": "b.py::two", "wall": 1.0, "cpu": 5.0},
        {"test": "a.py::three", "wall": 1.0, "cpu": 3.0},
    ]

    lines = summary(rows)

    assert lines[0] == "3 tests: 9.0 CPU-s, 4.0 s of wall"
    assert lines[2:4] == ["       5.0      1.0    1  b.py", "       4.0      3.0    2  a.py"]
    assert lines[5:] == [
        "       5.0      1.0  b.py::two",
        "       3.0      1.0  a.py::three",
        "       1.0      2.0  a.py::one",
    ]
