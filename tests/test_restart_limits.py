"""The restart tests' latency bound: fixed on a quiet machine, relative to the steady orders on a busy one."""

from testkit.harness import Stopped
from testkit.load import Ledger
from testkit.restarts import WARM_UP_SECONDS, Restart, clean_restart_problems

LIMIT = 0.250


def ledger_with(steady_seconds: float, during_seconds: float) -> tuple[Ledger, Restart]:
    """Orders every 50 ms for 3 s at `steady_seconds`, then a restart during which they take `during_seconds`."""
    ledger = Ledger()
    ledger.latencies = [(0.0, 2.0)]  # a first request that loads the API: warm-up, not steady
    ledger.latencies += [(0.05 * i, steady_seconds) for i in range(1, 60)]
    ledger.latencies += [(3.01 + 0.05 * i, during_seconds) for i in range(40)]
    restart = Restart(how="web: test", stopped=Stopped("web", 0.5, 0, 0), began=3.0, ready=4.0)
    return ledger, restart


def test_a_slow_restart_on_a_quiet_machine_is_a_problem():
    ledger, restart = ledger_with(steady_seconds=0.015, during_seconds=0.400)

    assert clean_restart_problems([restart], ledger, p99_limit=LIMIT) == ["web: test: order p99 400.0 ms"]


def test_a_busy_machine_is_allowed_its_noise_but_not_a_stall():
    ledger, restart = ledger_with(steady_seconds=0.150, during_seconds=0.400)
    assert clean_restart_problems([restart], ledger, p99_limit=LIMIT) == []

    ledger, restart = ledger_with(steady_seconds=0.150, during_seconds=0.500)
    assert clean_restart_problems([restart], ledger, p99_limit=LIMIT) == ["web: test: order p99 500.0 ms"]


def test_the_warm_up_does_not_count_as_steady():
    assert WARM_UP_SECONDS > 0.0
    ledger, restart = ledger_with(steady_seconds=0.015, during_seconds=0.400)

    # The 2 s first request alone would allow 6 s.
    assert clean_restart_problems([restart], ledger, p99_limit=LIMIT) != []
