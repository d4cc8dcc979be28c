"""scripts/demo.sh in a real terminal: Ctrl-C stops all it started; a killed run's leftovers are stopped next time."""

import os
import signal
import time

import pexpect
import pytest

from testkit.harness import ROOT
from testkit.processes import free_port, service_env

pytestmark = pytest.mark.slow


def running(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


# What scripts/demo.sh starts, each in its own process group.
DEMO_PROCESSES = ("web", "worker", "analytics", "beat", "relay")


def terminal(command: str, args: list[str] | None = None, **kwargs) -> pexpect.spawn:
    """Start `command` in a pseudo-terminal as a user's shell would, with Ctrl-C's SIGINT at its default.

    A process started in the background by a non-interactive shell (`cmd &` under nohup, a CI runner) ignores
    SIGINT, and so does every child it starts; a shell script cannot trap a signal ignored when it started. Whether
    the test process ignores it depends on how it was started and on what ran in it before (a SparkSession installs
    a handler, after which children start with the default again), not on the demo.
    """
    return pexpect.spawn(
        command,
        args or [],
        cwd=ROOT,
        encoding="utf-8",
        timeout=240,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        **kwargs,
    )


def demo_env(tmp_path, run_dir) -> dict[str, str]:
    """Return the environment of a demo on this test's databases, its own port and run directory, and few orders."""
    return service_env(
        REPORTS_DIR=str(tmp_path / "reports"), DEMO_PORT=str(free_port()), DEMO_RUN_DIR=str(run_dir), DEMO_ORDERS="5"
    )


def test_ctrl_c_stops_everything_and_a_killed_runs_leftovers_are_stopped(transactional_db, tmp_path):
    run_dir = tmp_path / "run"
    env = demo_env(tmp_path, run_dir)

    first = terminal("scripts/demo.sh", env=env)
    first.expect("Placing demo orders")
    leftovers = [int(line) for line in (run_dir / "demo.pgids").read_text().split()]
    first.kill(9)  # the terminal went away: no trap runs, the services stay up
    first.wait()
    started: list[int] = []
    second = None
    try:
        assert len(leftovers) == len(DEMO_PROCESSES) and all(running(pgid) for pgid in leftovers)

        second = terminal("scripts/demo.sh", env=env)
        second.expect(f"Stopping {len(DEMO_PROCESSES)} process groups an earlier demo left running")
        second.expect("Placing demo orders")
        assert not any(running(pgid) for pgid in leftovers)
        started = [int(line) for line in (run_dir / "demo.pgids").read_text().split()]
        # The web one step below the relay and the consumers sharing its host (docs/OPERATIONS.md, Nice=5).
        ours = os.getpriority(os.PRIO_PROCESS, 0)
        groups = zip(DEMO_PROCESSES, started, strict=True)
        niceness = {name: os.getpriority(os.PRIO_PROCESS, pgid) - ours for name, pgid in groups}
        assert niceness == {"web": 5, "worker": 0, "analytics": 0, "beat": 0, "relay": 0}

        interrupted = time.monotonic()
        second.sendintr()  # Ctrl-C, through the pseudo-terminal's line discipline
        # The demo's bound: 7 s for the groups to stop on SIGTERM, then up to 3 s for the SIGKILLed ones to be gone.
        second.expect("stopped.", timeout=12)
        second.expect(pexpect.EOF, timeout=5)
        assert time.monotonic() - interrupted < 12
        assert [name for name, pgid in zip(DEMO_PROCESSES, started, strict=True) if running(pgid)] == []
    finally:
        if second is not None:
            second.close(force=True)
        # Whatever failed above, no demo process outlives the test (it would serve the next tests' database).
        for pgid in leftovers + started:
            if running(pgid):
                os.killpg(pgid, 9)


def test_ctrl_c_stops_everything_when_the_output_goes_through_tee(transactional_db, tmp_path):
    """Ctrl-C reaches tee too; the stop handler's messages then hit a closed pipe and must not cut the clean-up."""
    run_dir = tmp_path / "run"
    env = demo_env(tmp_path, run_dir)
    demo = terminal("bash", ["-c", f"scripts/demo.sh | tee {tmp_path / 'demo.log'}"], env=env)
    started: list[int] = []
    try:
        demo.expect("Placing demo orders")
        started = [int(line) for line in (run_dir / "demo.pgids").read_text().split()]
        assert len(started) == len(DEMO_PROCESSES) and all(running(pgid) for pgid in started)

        demo.sendintr()  # to the terminal's foreground group: the script and tee alike
        demo.expect(pexpect.EOF, timeout=30)
        deadline = time.monotonic() + 15
        while any(running(pgid) for pgid in started) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [pgid for pgid in started if running(pgid)] == []
        assert not (run_dir / "demo.pgids").exists()
    finally:
        demo.close(force=True)
        for pgid in started:
            if running(pgid):
                os.killpg(pgid, 9)
