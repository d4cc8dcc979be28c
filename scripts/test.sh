#!/usr/bin/env bash
# Run the whole test suite against the real MariaDB, RabbitMQ and Redis (setting them up first if needed).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/pytest --create-db "$@"
