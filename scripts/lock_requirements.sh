#!/usr/bin/env bash
# Re-pin requirements/base.txt and requirements/dev.txt (exact versions and hashes of every package, transitive ones
# included) from their .in files with pip-compile. With no argument, nothing is upgraded: pins still allowed by the
# .in files stay. Pass pip-compile's own options through: `--upgrade-package celery` (one package and what it
# needs), `--upgrade` (everything). Then `scripts/setup.sh` installs the new pins and the tests decide.
# VENV names another virtualenv holding pip-tools (default .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
compile() {
  local name=$1
  shift
  CUSTOM_COMPILE_COMMAND=scripts/lock_requirements.sh "${VENV:-.venv}"/bin/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url \
    --no-emit-find-links "$@" \
    --output-file "requirements/$name.txt" "requirements/$name.in"
}
# base first: dev.in is constrained to base.txt's versions, so the service runs in tests on what it deploys with.
compile base "$@"
compile dev "$@"
