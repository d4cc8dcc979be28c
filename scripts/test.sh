#!/usr/bin/env bash
# Run the tests against the real MariaDB, RabbitMQ and Redis (setting them up first if needed).
#   scripts/test.sh                   the whole suite, as CI runs it, in two passes: every test but those marked
#                                     `alone` (a timing bound) or `exclusive` (it stops the shared broker) on two
#                                     pytest-xdist workers per core, each with its own databases, vhost and cache
#                                     prefix (conftest.py); then those in one process, with nothing else loading
#                                     the machine
#   TEST_WORKERS=N scripts/test.sh    the first pass on N workers; TEST_WORKERS=0 everything in one process
#   scripts/test.sh ARGS...           pytest ARGS in one pass on the same workers, where an `alone` or `exclusive`
#                                     test waits until no other worker is inside a test (testkit/workers.py)
# PYTEST_ADDOPTS reaches both passes (.ci/run adds --durations=20). README.md, "Tests", has how long they take here.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Two workers a core: most of a slow test is waiting (for a process to start, a deadline to pass), which another
# worker's test fills.
workers="${TEST_WORKERS:-$((2 * $(nproc)))}"
if [ $# -gt 0 ] || [ "$workers" = 0 ]; then
    exec .venv/bin/pytest --create-db -n "$workers" "$@"
fi
status=0
.venv/bin/pytest --create-db -n "$workers" -m "not alone and not exclusive" || status=$?
echo "==> The tests marked alone or exclusive, in one process"
.venv/bin/pytest --create-db -m "alone or exclusive" || status=$?
exit "$status"
