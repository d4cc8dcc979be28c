"""The soak's rolling restart: every process type restarted in turn while orders flow, and what it cost them.

The way an operator restarts (testkit/restarts.py): a gapless reload (TTIN, TTOU) and a HUP of gunicorn, each
gunicorn stopped and started while the other serves, then the relay, the outbox and credits workers and beat on
SIGTERM, and the analytics worker in the middle of a nightly run.
"""

import contextlib
import math
import os
import time

# The day the rolling restart's nightly run covers: one with no orders, so the requeued run is small.
ROLLING_NIGHTLY_DAY = "2001-05-06"
SECONDS_BETWEEN_RESTARTS = 3


def rolling_restart(cluster, backends) -> tuple[list, int]:
    """Restart every process type in turn, a few seconds apart, while the stream goes on; return the restarts and
    the id of the last nightly run recorded before them."""
    from analytics.models import NightlyRun
    from testkit.restarts import (
        reload_gunicorn,
        reload_gunicorn_gapless,
        restart,
        restart_behind_other,
        restart_mid_nightly_run,
    )
    from testkit.waiting import wait_for

    steps = [
        lambda: reload_gunicorn_gapless(cluster, "web"),
        lambda: reload_gunicorn(cluster, "web"),
        lambda: restart_behind_other(cluster, backends, "web"),
        lambda: restart_behind_other(cluster, backends, "web2"),
        *(lambda name=name: restart(cluster, name) for name in ("relay", "outbox", "credits", "beat")),
        lambda: restart_mid_nightly_run(cluster, ROLLING_NIGHTLY_DAY, spark_master_after="local[1]"),
    ]
    # Earlier soaks on this database ran the same day: only this one's runs count.
    earlier = NightlyRun.objects.filter(date=ROLLING_NIGHTLY_DAY).order_by("-id").values_list("id", flat=True).first()
    restarts = []
    for step in steps:
        time.sleep(SECONDS_BETWEEN_RESTARTS)
        restarts.append(step())
    # The requeued nightly run is a real (small) Spark job; orders keep flowing while it runs.
    succeeded = NightlyRun.objects.filter(
        date=ROLLING_NIGHTLY_DAY, status=NightlyRun.Status.SUCCEEDED, id__gt=earlier or 0
    )
    with contextlib.suppress(AssertionError):
        wait_for(succeeded.exists, timeout=600, what="the requeued nightly run to succeed")
    return restarts, earlier or 0


def rolling_restart_report(restarts: list, ledger, earlier_nightly: int) -> list[str]:
    """Print each restart's stop time and order p99, and the nightly run's record; return the problems found."""
    from analytics.models import NightlyRun
    from testkit.restarts import RESTART_P99_LIMIT_SECONDS, clean_restart_problems

    print(f"rolling restart:   (load average now {' '.join(f'{load:.2f}' for load in os.getloadavg())})")
    for item in restarts:
        print(f"  {item.summary(ledger)}")
    hup = [item for item in restarts if "HUP" in item.how]
    problems = clean_restart_problems(hup, ledger, p99_limit=math.inf) + clean_restart_problems(
        [item for item in restarts if item not in hup], ledger, p99_limit=RESTART_P99_LIMIT_SECONDS
    )
    nightly = [
        run.status for run in NightlyRun.objects.filter(date=ROLLING_NIGHTLY_DAY, id__gt=earlier_nightly).order_by("id")
    ]
    print(f"  nightly run for {ROLLING_NIGHTLY_DAY}: {nightly}")
    if nightly != ["interrupted", "succeeded"]:
        problems.append("the nightly run was not recorded interrupted, then re-run successfully")
    for problem in problems:
        print(f"  PROBLEM: {problem}")
    return problems
