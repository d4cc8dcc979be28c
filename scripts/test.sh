#!/usr/bin/env bash
# Run the whole test suite against the real MariaDB, RabbitMQ and Redis (setting them up first if needed).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# On parallel workers (TEST_WORKERS, "0" for none), each with its own databases, vhost and cache prefix (conftest.py).
exec .venv/bin/pytest --create-db -n "${TEST_WORKERS:-3}" "$@"
