#!/usr/bin/env bash
# Install what creditshop needs on Debian/Ubuntu, make sure MariaDB, RabbitMQ and Redis are up, and prepare the database.
# Idempotent: a second run only checks. Fails loudly (set -e) on the first step that does not work.
#
# Usage: scripts/setup.sh [-v|--verbose]   (or SETUP_VERBOSE=1)
# Prints one line per step; everything the steps print (apt, pip, migrations) goes to SETUP_LOG (default
# .run/setup.log), which a failure names. -v shows it all on the terminal as well.
set -euo pipefail
cd "$(dirname "$0")/.."

VERBOSE=${SETUP_VERBOSE:-0}
for arg in "$@"; do
  case $arg in
    -v | --verbose) VERBOSE=1 ;;
    -h | --help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup.sh: unknown option $arg (try --help)" >&2; exit 2 ;;
  esac
done
case $VERBOSE in 0 | 1) ;; *) echo "setup.sh: SETUP_VERBOSE=$VERBOSE is not 0 or 1" >&2; exit 2 ;; esac
SETUP_LOG=$(realpath -m "${SETUP_LOG:-.run/setup.log}")
mkdir -p "$(dirname "$SETUP_LOG")"
: >"$SETUP_LOG"
exec 3>&1  # the terminal: step lines and the failure message
if [ "$VERBOSE" = 1 ]; then
  exec > >(tee -a "$SETUP_LOG") 2>&1
else
  exec >>"$SETUP_LOG" 2>&1
fi
step=""
log() { step=$*; printf '==> %s\n' "$*" >&3; [ "$VERBOSE" = 1 ] || printf '\n==> %s\n' "$*"; }
on_exit() {
  local status=$?
  [ "$status" -eq 0 ] && return 0
  {
    echo "setup.sh failed (exit $status)${step:+ in step: $step}. The full log: $SETUP_LOG"
    [ "$VERBOSE" = 1 ] || { echo "Its last lines:"; tail -n 15 "$SETUP_LOG" | sed 's/^/    /'; }
  } >&3
}
trap on_exit EXIT
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
if [ "$VERBOSE" = 1 ]; then QUIET=(); DJANGO_VERBOSITY=1; else QUIET=(-q); DJANGO_VERBOSITY=0; fi

# chromium and chromium-driver: the browser tests (tests/browser/) drive the admin, reports and API docs pages.
# wrk: the HTTP load of bench/bench_orders.py. iproute2 (ss): connections per gunicorn worker, in that bench and in
# tests/test_gunicorn_conf.py. iptables: the silence fault helper drops a link's packets (testkit/silence.py).
# prometheus (promtool and the server) and prometheus-alertmanager (amtool): deploy/prometheus/ is checked and its
# alerts are tested on a real Prometheus (tests/test_prometheus_rules.py, tests/reliability/test_prometheus.py).
# systemd (systemd-analyze): tests/test_systemd_units.py verifies deploy/systemd/ offline; container images lack it.
# galera-4, rsync, haproxy and socat: scripts/mariadb_cluster.sh's three-node Galera cluster (replication, its state
# transfers, the writer endpoint, and the endpoint's admin socket).
packages=(libmariadb-dev pkg-config libmariadb-java openjdk-17-jre-headless python3-venv python3-dev build-essential
  chromium chromium-driver prometheus prometheus-alertmanager wrk iproute2 iptables systemd galera-4 rsync haproxy socat)
command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || packages+=(mariadb-server)
command -v rabbitmq-server >/dev/null 2>&1 || [ -x /usr/sbin/rabbitmq-server ] || packages+=(rabbitmq-server)
command -v redis-server >/dev/null 2>&1 || packages+=(redis-server)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  log "Installing system packages: ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

if ! mysqladmin -uroot -h127.0.0.1 ping >/dev/null 2>&1; then
  log "Starting MariaDB"
  as_root mkdir -p /run/mysqld && as_root chown mysql:mysql /run/mysqld 2>/dev/null || true
  as_root start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
  for _ in $(seq 60); do mysqladmin -uroot -h127.0.0.1 ping >/dev/null 2>&1 && break; sleep 1; done
  mysqladmin -uroot -h127.0.0.1 ping >/dev/null || { echo "MariaDB did not start" >&2; exit 1; }
fi

if ! as_root rabbitmqctl -q status >/dev/null 2>&1; then
  log "Starting RabbitMQ"
  as_root rabbitmq-server -detached
  as_root timeout 120 rabbitmqctl -q await_startup || { echo "RabbitMQ did not start" >&2; exit 1; }
fi

# The nightly run's message stays unacknowledged for the whole run (acks are late), up to the task's hard time limit,
# ANALYTICS_RUN_TIMEOUT_SECONDS + 120 s (3 h 2 min by default). RabbitMQ closes a channel whose delivery stays
# unacknowledged past its consumer_timeout (30 min by default), so it is raised to the run's timeout + 1 h, at once
# and in rabbitmq.conf for the next start. Hung awards are the workers' time limits' job (docs/OPERATIONS.md).
consumer_timeout_ms=$(( (${ANALYTICS_RUN_TIMEOUT_SECONDS:-10800} + 3600) * 1000 ))
current_ms=$(as_root rabbitmqctl -q eval 'application:get_env(rabbit, consumer_timeout).' | tr -dc '0-9')
if [ -n "$current_ms" ] && [ "$current_ms" -lt "$consumer_timeout_ms" ]; then
  log "Raising RabbitMQ's consumer_timeout to ${consumer_timeout_ms} ms (the nightly run holds its message)"
  as_root rabbitmqctl -q eval "application:set_env(rabbit, consumer_timeout, ${consumer_timeout_ms})." >/dev/null
  conf=/etc/rabbitmq/rabbitmq.conf
  if [ -d /etc/rabbitmq ]; then
    as_root sed -i '/^consumer_timeout *=/d' "$conf" 2>/dev/null || true
    echo "consumer_timeout = ${consumer_timeout_ms}" | as_root tee -a "$conf" >/dev/null
  fi
fi

# Redis holds only the rate-limit counters: nothing to persist, so no snapshots and no append-only file.
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  log "Starting Redis"
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no >/dev/null
  for _ in $(seq 30); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break; sleep 0.5; done
  redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null || { echo "Redis did not start" >&2; exit 1; }
fi

if ! mysql -uroot -h127.0.0.1 -e "SELECT 1" >/dev/null 2>&1 && as_root mysql -uroot -e "SELECT 1" >/dev/null 2>&1; then
  # A fresh Debian MariaDB lets root in over the socket only; the default DATABASE_URL connects over TCP.
  log "Letting root connect over 127.0.0.1 with an empty password (development default; set DATABASE_URL in production)"
  as_root mysql -uroot -e "ALTER USER root@localhost IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('')"
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  log "Creating the virtualenv (.venv)"
  "$PYTHON" -m venv .venv
fi
# requirements.txt includes the pinned files under requirements/: a change to any of them reinstalls.
requirements_state() { cat requirements.txt requirements/*.txt; }
if ! requirements_state | cmp -s - .venv/.requirements.installed; then
  log "Installing Python packages (requirements.txt)"
  .venv/bin/pip install "${QUIET[@]}" --upgrade pip
  # Byte-compiled at install (pip's default): with PYTHONDONTWRITEBYTECODE set, as it is on some machines, no import
  # would ever write a .pyc, and every process would compile what it imports from source at each start.
  .venv/bin/pip install "${QUIET[@]}" -r requirements.txt
  requirements_state > .venv/.requirements.installed
fi

log "Preparing the databases (orders: DATABASE_URL, credits: CREDITS_DATABASE_URL)"
# Each service's database is created if missing and migrated under its own alias; both may be one database.
.venv/bin/python - <<'PY'
import os

import MySQLdb

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
import django

django.setup()
from django.conf import settings

for alias, db in settings.DATABASES.items():
    server = MySQLdb.connect(
        host=db["HOST"] or "127.0.0.1", port=int(db["PORT"] or 3306), user=db["USER"], password=db["PASSWORD"]
    )
    server.cursor().execute(
        f"CREATE DATABASE IF NOT EXISTS `{db['NAME']}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
    )
    server.close()
PY
.venv/bin/python manage.py migrate --no-input -v "$DJANGO_VERBOSITY"
.venv/bin/python manage.py migrate --database credits --no-input -v "$DJANGO_VERBOSITY"
log "Collecting static files (served by WhiteNoise: hashed names, gzip copies)"
.venv/bin/python manage.py collectstatic --no-input -v "$DJANGO_VERBOSITY"
# The nightly job's class archive (analytics/class_archive.py): Spark's classes parsed once, mapped by every later
# session (the nightly runs, the tests' shared session), which then starts in about half the CPU. Once per pyspark
# and Java: a later setup finds it and only says so.
log "Spark class archive (written once per pyspark and Java)"
.venv/bin/python manage.py spark_class_archive --if-missing -v "$DJANGO_VERBOSITY"
log "Setup done"
