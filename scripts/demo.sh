#!/usr/bin/env bash
# One command: set up, start web + workers + beat + relay, place demo orders, watch credits arrive, run a nightly
# report, and keep everything running until Ctrl-C, which stops everything this script started.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

PORT=${DEMO_PORT:-${PORT:-8000}}
RUN_DIR=$(realpath -m "${DEMO_RUN_DIR:-.run}")
mkdir -p "$RUN_DIR/logs"
export PROMETHEUS_MULTIPROC_DIR="$RUN_DIR/prometheus"
rm -rf "$PROMETHEUS_MULTIPROC_DIR" && mkdir -p "$PROMETHEUS_MULTIPROC_DIR"
PY=.venv/bin/python
# Each process runs in its own session (setsid), so Ctrl-C reaches only this script, and stopping a process group
# takes its children too (Celery's pool, gunicorn's workers). The groups are recorded, so a run that was killed
# before it could clean up is cleaned up by the next one.
PGID_FILE="$RUN_DIR/demo.pgids"

group_alive() { kill -0 -- "-$1" 2>/dev/null; }
await_groups() {  # tenths pgid...: wait up to that long for every group to be gone; fail if one is left
  local tenths=$1 pgid alive
  shift
  for _ in $(seq "$tenths"); do
    alive=0
    for pgid in "$@"; do group_alive "$pgid" && alive=1; done
    [ "$alive" -eq 0 ] && return 0
    sleep 0.1
  done
  return 1
}
stop_groups() {  # pgid...: TERM each group, wait up to 7 s, then KILL what is left and wait until it is gone
  local pgid
  for pgid in "$@"; do kill -TERM -- "-$pgid" 2>/dev/null || true; done
  await_groups 70 "$@" && return 0
  for pgid in "$@"; do kill -KILL -- "-$pgid" 2>/dev/null || true; done
  # SIGKILL is delivered at once, but a process is gone only when the kernel has freed it (a large JVM takes a
  # moment) and its parent, this shell, has reaped it.
  await_groups 30 "$@" || true
}

if [ -f "$PGID_FILE" ]; then
  leftovers=()
  while read -r pgid; do
    # Only groups still running from this checkout: a recycled id belongs to someone else.
    [ -n "$pgid" ] && group_alive "$pgid" && [ "$(readlink "/proc/$pgid/cwd" 2>/dev/null)" = "$PWD" ] && leftovers+=("$pgid")
  done <"$PGID_FILE"
  if [ ${#leftovers[@]} -gt 0 ]; then
    echo "==> Stopping ${#leftovers[@]} process groups an earlier demo left running"
    stop_groups "${leftovers[@]}"
  fi
  rm -f "$PGID_FILE"
fi

pids=()
say() { echo "$@" 2>/dev/null || true; }  # the terminal or pipe may be gone: never let a message stop the clean-up
stop_all() {
  trap - INT TERM EXIT
  # Under `demo.sh | tee demo.log`, Ctrl-C stops tee too: a write to its pipe would raise SIGPIPE and kill this
  # script before it stops anything. Ignored, the write just fails and the processes are stopped all the same.
  trap '' PIPE
  say
  say "==> Stopping everything the demo started"
  [ ${#pids[@]} -gt 0 ] && stop_groups "${pids[@]}"
  rm -f "$PGID_FILE"
  say "stopped."
}
trap 'stop_all; exit 130' INT TERM
trap stop_all EXIT

start() {  # name, command...
  local name=$1; shift
  setsid "$@" >"$RUN_DIR/logs/$name.log" 2>&1 </dev/null &
  pids+=($!)
  echo "$!" >>"$PGID_FILE"
  echo "    $name (pid $!, log $RUN_DIR/logs/$name.log)"
}

echo "==> Admin user"
ADMIN_PASSWORD=$($PY -c "import secrets; print(secrets.token_urlsafe(12))")
DJANGO_SUPERUSER_PASSWORD=$ADMIN_PASSWORD $PY manage.py createsuperuser --noinput --username admin \
  --email admin@example.com >/dev/null 2>&1 || \
  $PY manage.py shell --verbosity 0 -c "from django.contrib.auth import get_user_model as g; u=g().objects.get(username='admin'); u.set_password('$ADMIN_PASSWORD'); u.save()"
$PY manage.py shell --verbosity 0 -c "from django.contrib.auth import get_user_model as g; g().objects.get_or_create(username='demo')"
# A fresh API key each run (only its digest is stored, so the last run's cannot be read back); the old one is revoked.
$PY manage.py revoke_api_tokens demo --name demo >/dev/null
TOKEN=$($PY manage.py create_api_token demo --name demo --expires-days 1 | tail -n 1)

echo "==> Starting processes"
# The web one step below the relay and the consumers that share this host (docs/OPERATIONS.md, Nice=5): orders
# already committed reach their credit before the web takes both cores for the next ones.
start web nice -n 5 .venv/bin/gunicorn config.wsgi --bind "127.0.0.1:$PORT" --workers 4 --threads 2
start worker .venv/bin/celery -A config worker -Q outbox,credits --concurrency 2 --loglevel INFO
# The nightly run gets a worker of its own, so a Spark job never holds the outbox worker (config/celery.py).
start analytics .venv/bin/celery -A config worker -Q analytics --concurrency 1 -n analytics@%h --loglevel INFO
start beat .venv/bin/celery -A config beat --loglevel INFO --schedule "$RUN_DIR/celerybeat-schedule"
start relay $PY manage.py relay_outbox

for _ in $(seq 60); do curl -fs "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break; sleep 1; done
curl -fs "http://127.0.0.1:$PORT/healthz" >/dev/null || { echo "web did not become healthy; see $RUN_DIR/logs" >&2; exit 1; }

echo "==> Placing demo orders as user 'demo'"
$PY scripts/demo_client.py --base-url "http://127.0.0.1:$PORT" --token="$TOKEN" --orders "${DEMO_ORDERS:-50}"

echo "==> Seeding a week of history and running last night's report"
YESTERDAY=$(date -u -d yesterday +%F)
$PY manage.py seed_demo_data --orders "${DEMO_HISTORY_ORDERS:-20000}" --days 7 --end "$YESTERDAY"
$PY manage.py run_nightly_reports --date "$YESTERDAY"

REPORTS=$($PY -c "import os; os.environ.setdefault('DJANGO_SETTINGS_MODULE','config.settings'); import django; django.setup(); from django.conf import settings; print(settings.REPORTS_DIR)")
cat <<EOF2

creditshop is running. Ctrl-C stops everything.
  API docs:        http://127.0.0.1:$PORT/api/docs/
  Admin:           http://127.0.0.1:$PORT/admin/   (user admin, password $ADMIN_PASSWORD)
  Reports page:    http://127.0.0.1:$PORT/reports/
  Nightly report:  $REPORTS/$YESTERDAY/
  Demo API token:  $TOKEN
  Health, metrics: http://127.0.0.1:$PORT/healthz  http://127.0.0.1:$PORT/metrics
EOF2
wait
