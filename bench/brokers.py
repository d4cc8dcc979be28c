"""Run a benchmark on one broker node and on a quorum-queue cluster, interleaved, and report every run of both.

A benchmark given ``--cluster-broker-url URL`` runs itself again in subprocesses, alternating its configured
CELERY_BROKER_URL (one node, CELERY_QUEUE_TYPE as configured) with URL (CELERY_QUEUE_TYPE=quorum), so load from
other work on a shared machine falls on both sides alike; medians and the per-pair ratio are printed at the end.
"""

import os
import re
import statistics
import subprocess
import sys

CLUSTER_OPTION = "--cluster-broker-url"


def _argv_without_cluster_options(argv: list[str]) -> list[str]:
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in (CLUSTER_OPTION, "--compare-repeat"):
            skip = True
        elif not arg.startswith((f"{CLUSTER_OPTION}=", "--compare-repeat=")):
            kept.append(arg)
    return kept


def add_arguments(parser) -> None:
    parser.add_argument(
        CLUSTER_OPTION,
        metavar="URL",
        help="also run on this quorum-queue cluster (e.g. 'amqp://h1/v;amqp://h2/v;amqp://h3/v'), interleaved",
    )
    parser.add_argument("--compare-repeat", type=int, default=3, help="runs on each side with --cluster-broker-url")


def compare(*, cluster_url: str, repeat: int, figure: str, unit: str) -> int:
    """Run this script `repeat` times on each side; `figure` is a regex whose group 1 is the number to compare."""
    script, argv = sys.argv[0], _argv_without_cluster_options(sys.argv[1:])
    sides = {
        "one node": {},
        "cluster": {"CELERY_BROKER_URL": cluster_url, "CELERY_QUEUE_TYPE": "quorum"},
    }
    results: dict[str, list[float]] = {side: [] for side in sides}
    failed = 0
    for run in range(1, repeat + 1):
        for side, env in sides.items():
            proc = subprocess.run(
                [sys.executable, script, *argv], env={**os.environ, **env}, capture_output=True, text=True
            )
            match = re.search(figure, proc.stdout)
            if proc.returncode != 0 or not match:
                # Reported, and left out of the medians: a shared machine fails a run now and then.
                print(proc.stdout[-1500:], proc.stderr[-1500:], sep="\n")
                print(f"run {run} {side:>8}: FAILED (exit {proc.returncode})", flush=True)
                failed += 1
                continue
            results[side].append(float(match.group(1).replace(",", "")))
            print(f"run {run} {side:>8}: {results[side][-1]:,.0f} {unit}  | {match.group(0).strip()}", flush=True)
    for side, values in results.items():
        if values:
            print(f"median {side:>8}: {statistics.median(values):,.0f} {unit} over {len(values)} runs")
    if results["one node"] and results["cluster"]:
        ratio = statistics.median(results["cluster"]) / statistics.median(results["one node"])
        print(f"cluster / one node: {ratio:.2f} (ratio of the medians)")
    return 1 if failed else 0
