"""scripts/setup.sh: one line per step on the terminal, everything else in a log file it names when a step fails."""

import subprocess

import pytest

from testkit.harness import ROOT
from testkit.processes import free_port, mysql_url, service_env

pytestmark = pytest.mark.slow


def setup(tmp_path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, str]:
    log = tmp_path / "setup.log"
    environment = service_env(SETUP_LOG=str(log), DJANGO_STATIC_ROOT=str(tmp_path / "static"), **env)
    environment.pop("SETUP_VERBOSE", None)
    environment.update(env)
    done = subprocess.run(
        ["scripts/setup.sh", *args], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600
    )
    return done, log.read_text() if log.exists() else ""


def test_a_run_shows_one_line_per_step_and_keeps_the_rest_in_its_log(transactional_db, tmp_path):
    done, log = setup(tmp_path)

    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines and all(line.startswith("==> ") for line in lines), done.stdout
    assert lines[-1] == "==> Setup done"
    assert done.stderr == ""
    assert "==> Collecting static files" in log
    # The Spark class archive: written by the first setup on a machine, found by every later one.
    assert "class archive present: " in log or "class archive written: " in log


def test_verbose_shows_what_the_steps_print(transactional_db, tmp_path):
    done, log = setup(tmp_path, "-v")

    assert done.returncode == 0, done.stdout + done.stderr
    assert "No migrations to apply." in done.stdout
    assert "No migrations to apply." in log


def test_a_failed_step_is_named_with_the_log_that_has_the_whole_error(transactional_db, tmp_path):
    nowhere = mysql_url(host="127.0.0.1", port=free_port(), name="nothing")

    done, log = setup(tmp_path, DATABASE_URL=nowhere)

    assert done.returncode != 0
    assert "failed (exit 1) in step: Preparing the databases" in done.stdout
    assert f"The full log: {tmp_path / 'setup.log'}" in done.stdout
    assert "Can't connect" in log and "Traceback" in log


def test_an_unknown_option_is_refused(tmp_path):
    done = subprocess.run(["scripts/setup.sh", "--bogus"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "unknown option --bogus" in done.stderr
