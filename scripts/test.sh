#!/usr/bin/env bash
# Run the tests against the real MariaDB, RabbitMQ and Redis (setting them up first if needed).
#   scripts/test.sh [PYTEST ARGS...]  the whole suite (or the tests ARGS select), as CI runs it, in two passes: every
#                                     test but those marked `alone` (a timing bound) or `exclusive` (it stops the
#                                     shared broker) on two pytest-xdist workers per core, each with its own
#                                     databases, vhost and cache prefix (conftest.py); then those in one process,
#                                     with nothing else loading the machine. ARGS go to both passes.
#   TEST_WORKERS=N scripts/test.sh    the first pass on N workers; TEST_WORKERS=0 everything in one pytest process
# README.md, "Tests", has how long they take here.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Two workers a core: most of a slow test is waiting (for a process to start, a deadline to pass), which another
# worker's test fills.
workers="${TEST_WORKERS:-$((2 * $(nproc)))}"
if [ "$workers" = 0 ]; then
    exec .venv/bin/pytest --create-db "$@"
fi
# pytest's exit status 5: the pass selected no test (ARGS naming only tests of the other pass).
NOTHING_SELECTED=5
first=0
second=0
.venv/bin/pytest --create-db -n "$workers" -m "not alone and not exclusive" "$@" || first=$?
echo "==> The tests marked alone or exclusive, in one process"
.venv/bin/pytest --create-db -m "alone or exclusive" "$@" || second=$?
if [ "$first" = "$NOTHING_SELECTED" ] && [ "$second" = "$NOTHING_SELECTED" ]; then
    exit "$NOTHING_SELECTED"
fi
for status in "$first" "$second"; do
    if [ "$status" != 0 ] && [ "$status" != "$NOTHING_SELECTED" ]; then
        exit "$status"
    fi
done
