#!/usr/bin/env bash
# Run the tests against the real MariaDB, RabbitMQ and Redis (setting them up first if needed).
#   scripts/test.sh                   the whole suite in one process (as CI runs it)
#   TEST_WORKERS=4 scripts/test.sh    the whole suite in two passes: all but the tests marked `alone` or `exclusive`
#                                     on 4 parallel workers, each with its own databases, vhost and cache prefix
#                                     (conftest.py); then those in one process, on a machine nothing else is loading
#                                     (their bounds are timings, or they stop the broker every worker shares)
#   scripts/test.sh ARGS...           pytest ARGS in one process (TEST_WORKERS=N spreads them over N workers)
# One process stays the default until the two passes pass on a fresh clone twice in a row (README, "Tests").
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
workers="${TEST_WORKERS:-0}"
if [ $# -gt 0 ] || [ "$workers" = 0 ]; then
    exec .venv/bin/pytest --create-db -n "$workers" "$@"
fi
status=0
.venv/bin/pytest --create-db -n "$workers" -m "not alone and not exclusive" || status=$?
echo "==> The tests marked alone or exclusive, in one process"
.venv/bin/pytest --create-db -m "alone or exclusive" || status=$?
exit "$status"
