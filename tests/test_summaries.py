"""A fault test's account of its run (testkit/summaries.py) is shown at the run's end, passed or failed, when the run
is split over pytest-xdist workers, whose own output goes nowhere."""

import subprocess
from pathlib import Path

from django.conf import settings

from testkit.harness import VENV_BIN

TESTS = """
def test_recovers(summary):
    summary("faults: 2\\nevery order credited 5.2 s after the last fault")


def test_loses_an_order(summary):
    summary("lost 1")
    assert False


def test_says_nothing():
    pass
"""


def test_each_tests_account_is_listed_under_its_id_and_outcome_after_a_run_on_workers(tmp_path: Path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_accounts.py").write_text(TESTS)

    run = subprocess.run(
        [str(VENV_BIN / "pytest"), "-p", "testkit.summaries", "-p", "no:cacheprovider", "-n", "2", str(tmp_path)],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(settings.BASE_DIR)},
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert run.returncode == 1, run.stdout + run.stderr
    listed = run.stdout[run.stdout.index("what the fault tests saw") :]
    assert "test_accounts.py::test_loses_an_order (failed, " in listed
    assert "  lost 1\n" in listed
    assert "test_accounts.py::test_recovers (passed, " in listed
    assert "  faults: 2\n  every order credited 5.2 s after the last fault\n" in listed
    assert "test_says_nothing" not in listed
