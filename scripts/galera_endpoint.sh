# shellcheck shell=bash
# The writer endpoint of scripts/mariadb_cluster.sh, which sources this file and defines what it uses (NODES, address,
# the ports, PYTHON, pid_of, running): haproxy on 127.0.0.1:ENDPOINT_PORT in front of the nodes, its health checker
# (scripts/galera_health.py), its start, and the node it writes to.

write_endpoint_config() {
  local dir=$1
  {
    cat <<EOF
global
  pidfile $dir/haproxy.pid
  stats socket $dir/haproxy.sock mode 600 level admin
  maxconn 4000
  # Without it haproxy binds with SO_REUSEPORT, and an endpoint a killed run left behind would share the port with
  # this one, taking some of its connections to its own choice of writer; with it the second one fails to start.
  noreuseport

defaults
  mode tcp
  timeout connect 1s
  # Idle connections are kept as long as the service's persistent ones (CONN_MAX_AGE) may wait between uses.
  timeout client 30m
  timeout server 30m
  timeout check 1500ms

# One writer at a time: connections go to the node in the single-entry stick table while it is up; "balance first"
# picks the lowest-numbered healthy node when it is not. A node that comes back does not take the writes back (that
# would leave two nodes writing while older connections drain); only a failure moves them.
listen writer
  bind 127.0.0.1:$ENDPOINT_PORT
  balance first
  stick-table type integer size 1
  stick on int(1)
  option httpchk GET /
  default-server check inter 500ms fall 2 rise 2 on-marked-down shutdown-sessions
EOF
    for n in "${NODES[@]}"; do
      echo "  server gal$n $(address "$n"):$((BASE_PORT + n)) id $n addr 127.0.0.1 port $((CHECK_BASE_PORT + n))"
    done
  } >"$dir/haproxy.cfg"
}

# The health checker's interpreter and its driver, before anything starts: without a health checker the endpoint
# sends no connection anywhere.
check_health_checker() {
  local output
  if ! output=$("$PYTHON" -c 'import MySQLdb' 2>&1); then
    echo "the health checker cannot run: $PYTHON -c 'import MySQLdb' failed: ${output:-no output}" >&2
    echo "(GALERA_CLUSTER_PYTHON names a Python with mysqlclient; the default is the checkout's .venv)" >&2
    exit 1
  fi
}

start_endpoint() {
  local dir=$1 checks=() n waiting writer_node="" name="" error=""
  check_health_checker
  if ! pid_of "$dir/health.pid" >/dev/null; then
    for n in "${NODES[@]}"; do checks+=("$(address "$n"):$((BASE_PORT + n)):$((CHECK_BASE_PORT + n))"); done
    setsid "$PYTHON" "$ROOT/scripts/galera_health.py" 127.0.0.1 "${checks[@]}" >>"$dir/health.log" 2>&1 </dev/null &
    echo $! >"$dir/health.pid"
  fi
  for _ in $(seq 40); do
    waiting=0
    for n in "${NODES[@]}"; do
      timeout 1 bash -c ">/dev/tcp/127.0.0.1/$((CHECK_BASE_PORT + n))" 2>/dev/null || waiting=1
    done
    [ "$waiting" = 0 ] && break
    running "$(cat "$dir/health.pid")" || break
    sleep 0.25
  done
  if [ "$waiting" = 1 ]; then
    echo "the health checker is not answering on its ports (127.0.0.1:$((CHECK_BASE_PORT + 1))..); $dir/health.log:" >&2
    tail -n 5 "$dir/health.log" >&2
    exit 1
  fi
  if ! pid_of "$dir/haproxy.pid" >/dev/null; then
    haproxy -D -f "$dir/haproxy.cfg" >>"$dir/haproxy.log" 2>&1 || { echo "haproxy failed; see $dir/haproxy.log" >&2; exit 1; }
  fi
  # Up means a client's connection through the endpoint reaches the node it says it writes to, not only that its
  # health checks pass: a check that lies, or a node that refuses the endpoint, would leave every client refused.
  local deadline=$((SECONDS + ENDPOINT_TIMEOUT))
  while [ "$SECONDS" -lt "$deadline" ]; do
    writer_node=$(writer "$dir")
    if [ -n "$writer_node" ]; then
      if name=$(timeout 5 mysql --no-defaults -uroot -h127.0.0.1 -P"$ENDPOINT_PORT" --connect-timeout=2 -N -B \
        -e 'SELECT @@wsrep_node_name' 2>&1); then
        [ "$name" = "gal$writer_node" ] && { echo "endpoint up on 127.0.0.1:$ENDPOINT_PORT, writing to $name"; return; }
        error="it reached $name"
      else
        error=$name
      fi
    fi
    sleep 0.25
  done
  if [ -z "$writer_node" ]; then
    echo "the endpoint found no healthy node; see $dir/health.log" >&2
  else
    echo "no connection through the endpoint 127.0.0.1:$ENDPOINT_PORT reached its writer gal$writer_node: $error" >&2
    echo "see $dir/health.log and $dir/haproxy.log" >&2
  fi
  exit 1
}

haproxy_command() { echo "$2" | socat -t 2 - "UNIX-CONNECT:$1/haproxy.sock"; }

# The node the endpoint sends new connections to: the one in its stick table while that one is up, else the first up.
writer() {
  local dir=$1 up stuck
  up=$(haproxy_command "$dir" "show servers state writer" 2>/dev/null \
    | awk '$1 ~ /^[0-9]+$/ && $6 == 2 {print $3}') || return 0
  stuck=$(haproxy_command "$dir" "show table writer" 2>/dev/null | sed -n 's/.*server_id=\([0-9]*\).*/\1/p')
  if [ -n "$stuck" ] && grep -qx "$stuck" <<<"$up"; then echo "$stuck"; else head -n 1 <<<"$up"; fi
}
