#!/usr/bin/env bash
# Install what creditshop needs on Debian/Ubuntu, make sure MariaDB, RabbitMQ and Redis are up, and prepare the database.
# Idempotent: a second run only checks. Fails loudly (set -e) on the first step that does not work.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n==> %s\n' "$*"; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# chromium and chromium-driver: the browser tests (tests/browser/) drive the admin, reports and API docs pages.
# wrk: the HTTP load of bench/bench_orders.py.
packages=(libmariadb-dev pkg-config libmariadb-java openjdk-17-jre-headless python3-venv python3-dev build-essential
  chromium chromium-driver wrk)
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
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -r requirements.txt
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
.venv/bin/python manage.py migrate --no-input -v 0
.venv/bin/python manage.py migrate --database credits --no-input -v 0
log "Collecting static files (served by WhiteNoise: hashed names, gzip copies)"
.venv/bin/python manage.py collectstatic --no-input -v 0
log "Setup done"
