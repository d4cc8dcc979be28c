#!/usr/bin/env bash
# Run the tests against the real MariaDB, RabbitMQ and Redis (setting them up first if needed).
#   scripts/test.sh                   the whole suite on one pytest-xdist worker per core (as CI runs it); each worker
#                                     has its own databases, vhost and cache prefix (conftest.py), and a test marked
#                                     `alone` (a timing bound) or `exclusive` (it stops the shared broker) runs while
#                                     no other worker is inside a test (testkit/workers.py)
#   TEST_WORKERS=N scripts/test.sh    on N workers; TEST_WORKERS=0 in one process
#   scripts/test.sh ARGS...           pytest ARGS, on the same workers
# README.md, "Tests", has the commands and how long they take here.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/pytest --create-db -n "${TEST_WORKERS:-$(nproc)}" "$@"
