#!/usr/bin/env bash
# Run the whole test suite against the real MariaDB, RabbitMQ and Redis (setting them up first if needed).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# TEST_WORKERS=N runs it on N parallel workers, each with its own databases, vhost and cache prefix (conftest.py):
# about 16 minutes instead of 30 on two cores, but its timing-bound tests are not yet reliable beside each other's
# load (README, "Tests"), so the default stays one process.
exec .venv/bin/pytest --create-db -n "${TEST_WORKERS:-0}" "$@"
