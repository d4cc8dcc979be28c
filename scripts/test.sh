#!/usr/bin/env bash
# Run the tests against the real MariaDB, RabbitMQ and Redis (setting them up first if needed).
#   scripts/test.sh            the whole suite: on TEST_WORKERS parallel workers (4), each with its own databases,
#                              vhost and cache prefix (conftest.py), all but the tests marked `alone` or `exclusive`;
#                              then those in one process, on a machine nothing else is loading (their bounds are
#                              timings, or they stop the broker every worker shares)
#   scripts/test.sh ARGS...    pytest ARGS in one process (TEST_WORKERS=N spreads them over N workers)
# TEST_WORKERS=0 runs the whole suite in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if [ $# -gt 0 ]; then
    exec .venv/bin/pytest --create-db -n "${TEST_WORKERS:-0}" "$@"
fi
workers="${TEST_WORKERS:-4}"
if [ "$workers" = 0 ]; then
    exec .venv/bin/pytest --create-db
fi
status=0
.venv/bin/pytest --create-db -n "$workers" -m "not alone and not exclusive" || status=$?
echo "==> The tests marked alone or exclusive, in one process"
.venv/bin/pytest --create-db -m "alone or exclusive" || status=$?
exit "$status"
