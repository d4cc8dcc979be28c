#!/usr/bin/env bash
# Run the tests against the real MariaDB, RabbitMQ and Redis (setting them up first if needed).
#   scripts/test.sh [PYTEST ARGS...]  the whole suite (or the tests ARGS select), as CI runs it, in three passes:
#                                     every test but those marked `alone` (a timing bound) or `paired` (seconds of
#                                     failover or start-up) on a pytest-xdist worker per core and one more, each
#                                     with its own databases, vhost and cache prefix (conftest.py); then the `paired`
#                                     ones on two workers, each beside one other at most; then the `alone` ones in one
#                                     process, with nothing else running. ARGS go to every pass.
#   TEST_WORKERS=N scripts/test.sh    the first pass on N workers; TEST_WORKERS=0 everything in one pytest process
# README.md, "Tests", has how long they take here.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# A worker a core and one more: most of a slow test is waiting (for a process to start, a deadline to pass), which
# the extra worker's test fills. Two a core overload the cores instead: the pass is no shorter, the host spends more
# CPU on it, and a test running a JVM of its own takes several times its idle wall (README.md, "Tests").
workers="${TEST_WORKERS:-$(($(nproc) + 1))}"
# The second pass's workers: what the `paired` tests' bounds were measured beside (testkit/workers.py).
PAIRED=$(.venv/bin/python -c "from testkit.workers import PAIRED; print(PAIRED)")
if [ "$workers" = 0 ]; then
    exec .venv/bin/pytest --create-db "$@"
fi
# pytest's exit status 5: the pass selected no test (ARGS naming only tests of another pass).
NOTHING_SELECTED=5
statuses=()
run_pass() {
    local status=0
    .venv/bin/pytest --create-db "$@" || status=$?
    statuses+=("$status")
}
run_pass -n "$workers" -m "not alone and not paired" "$@"
echo "==> The tests marked paired, on $PAIRED workers"
run_pass -n "$PAIRED" -m "paired" "$@"
echo "==> The tests marked alone, in one process"
run_pass -m "alone" "$@"
selected=0
for status in "${statuses[@]}"; do
    if [ "$status" != 0 ] && [ "$status" != "$NOTHING_SELECTED" ]; then
        exit "$status"
    fi
    if [ "$status" = 0 ]; then
        selected=1
    fi
done
if [ "$selected" = 0 ]; then
    exit "$NOTHING_SELECTED"
fi
