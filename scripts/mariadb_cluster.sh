#!/usr/bin/env bash
# A three-node MariaDB Galera cluster on one machine, beside the system server, with one writer endpoint in front.
#
#   scripts/mariadb_cluster.sh start DIR          start gal1..gal3 and the endpoint (prints the endpoint's DATABASE_URL)
#   scripts/mariadb_cluster.sh start-endpoint DIR start the health checker and the endpoint in front of running nodes
#   scripts/mariadb_cluster.sh stop DIR           stop the endpoint, then every node gracefully (SIGTERM by pid)
#   scripts/mariadb_cluster.sh status DIR         how many nodes the primary component has, and each node's state
#   scripts/mariadb_cluster.sh database-url DIR   the endpoint's DATABASE_URL (database GALERA_CLUSTER_DATABASE)
#   scripts/mariadb_cluster.sh start-node DIR N   start node N (1..3) and wait until it is Synced; it rejoins by itself
#   scripts/mariadb_cluster.sh kill-node DIR N    SIGKILL node N: a crash, no goodbye to the cluster
#   scripts/mariadb_cluster.sh stop-node DIR N    SIGTERM node N: a graceful stop (it leaves the cluster first)
#   scripts/mariadb_cluster.sh pid DIR N          mariadbd's pid of node N
#   scripts/mariadb_cluster.sh writer DIR         the node the endpoint sends connections to now
#   scripts/mariadb_cluster.sh node-url DIR N     a DATABASE_URL naming node N itself (reads beside the writer)
#   scripts/mariadb_cluster.sh bootstrap-node DIR N  make running node N's component primary: only when the nodes
#                                                 it does not see are known to be down, never during a partition
#
# Node N listens on its own loopback address ADDRESS_PREFIX.N (127.0.3.N) so that one node can be cut off from the
# others and from its clients by address (testkit/silence.py), with MySQL on BASE_PORT+N (3401..3403), Galera
# replication on GALERA_BASE_PORT+N (4561..4563), incremental state transfer on IST_BASE_PORT+N (4571..4573) and full
# state transfer on SST_BASE_PORT+N (4581..4583); its config, data and log under DIR/galN.
#
# The endpoint is haproxy on 127.0.0.1:ENDPOINT_PORT (3410). It sends every connection to one node at a time, so the
# cluster has a single writer: it keeps to that node (a one-entry stick table) for as long as its health check passes,
# and moves to the first healthy node when it fails, closing the connections left on the failed one. The health check
# reads the node's Galera state, not its port: scripts/galera_health.py answers on CHECK_BASE_PORT+N (3421..3423) with
# 200 only while node N is Synced and wsrep_ready. Full state transfers use rsync (wsrep_sst_method), the method
# Debian's packages carry with nothing more to install (mariabackup needs the mariadb-backup package; production should
# use it, since an rsync donor blocks its writes for the copy).
#
# Nothing starts while another process listens on an address and port the cluster is to use (a server already answering
# on a node's port would take the tests' connections in its place): start, start-endpoint and start-node name the
# holder and fail. The cluster's own processes (by DIR's pid files) are not in the way of a start that finds them
# running. start fails, naming the cause, when the health checker cannot run, and reports the endpoint up only once a
# connection through it reaches the writer.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
ADDRESS_PREFIX=${GALERA_CLUSTER_ADDRESS_PREFIX:-127.0.3}
BASE_PORT=${GALERA_CLUSTER_BASE_PORT:-3400}
GALERA_BASE_PORT=${GALERA_CLUSTER_GALERA_BASE_PORT:-4560}
IST_BASE_PORT=${GALERA_CLUSTER_IST_BASE_PORT:-4570}
SST_BASE_PORT=${GALERA_CLUSTER_SST_BASE_PORT:-4580}
CHECK_BASE_PORT=${GALERA_CLUSTER_CHECK_BASE_PORT:-3420}
ENDPOINT_PORT=${GALERA_CLUSTER_ENDPOINT_PORT:-3410}
DATABASE=${GALERA_CLUSTER_DATABASE:-creditshop}
START_TIMEOUT=${GALERA_CLUSTER_START_TIMEOUT:-120}
# How long the endpoint may take to let a connection reach the writer once the nodes are Synced.
ENDPOINT_TIMEOUT=${GALERA_CLUSTER_ENDPOINT_TIMEOUT:-15}
PYTHON=${GALERA_CLUSTER_PYTHON:-$ROOT/.venv/bin/python}
GALERA_PROVIDER=${GALERA_PROVIDER:-/usr/lib/galera/libgalera_smm.so}
# Started by root, a node runs as this user, as the system server does: rsync's state transfer daemon, run by root,
# would drop to "nobody" and fail to write the joiner's data directory.
RUN_AS=${GALERA_CLUSTER_USER:-mysql}
NODES=(1 2 3)
# The writer endpoint: haproxy's config, the health checker, the endpoint's start and its writer.
# shellcheck source=scripts/galera_endpoint.sh
. "$ROOT/scripts/galera_endpoint.sh"

usage() { sed -n '2,15p' "$0" >&2; exit 2; }

address() { echo "$ADDRESS_PREFIX.$1"; }

cluster_address() {
  local members=()
  for n in "${NODES[@]}"; do members+=("$(address "$n"):$((GALERA_BASE_PORT + n))"); done
  (IFS=,; echo "gcomm://${members[*]}")
}

write_node_config() {
  local dir=$1 n=$2 node_dir="$1/gal$2" ip
  ip=$(address "$n")
  mkdir -p "$node_dir"
  cat >"$node_dir/my.cnf" <<EOF
[mysqld]
datadir=$node_dir/data
bind-address=$ip
port=$((BASE_PORT + n))
socket=$node_dir/mysqld.sock
# A tmpdir of its own: a starting mariadbd deletes every #sql* file in its tmpdir, another server's too.
tmpdir=$node_dir/tmp
pid-file=$node_dir/mysqld.pid
log-error=$node_dir/error.log
$([ "$(id -u)" -eq 0 ] && echo "user=$RUN_AS")
skip-name-resolve
character-set-server=utf8mb4
collation-server=utf8mb4_unicode_ci
# Small, because the machine is shared: a test's tables fit many times over.
innodb-buffer-pool-size=64M
innodb-log-file-size=32M
max-connections=300
# What Galera requires: row-based write sets, InnoDB, and interleaved auto-increment locks (no table lock per insert).
binlog_format=ROW
default_storage_engine=InnoDB
innodb_autoinc_lock_mode=2
wsrep_on=ON
wsrep_provider=$GALERA_PROVIDER
wsrep_cluster_name=creditshop
wsrep_cluster_address=$(cluster_address)
wsrep_node_name=gal$n
wsrep_node_address=$ip:$((GALERA_BASE_PORT + n))
wsrep_node_incoming_address=$ip:$((BASE_PORT + n))
wsrep_sst_method=rsync
wsrep_sst_receive_address=$ip:$((SST_BASE_PORT + n))
# The failure detector's timeouts decide how long writes wait when a node vanishes without a goodbye (SIGKILL, a
# silent network): the survivors suspect it after evs.suspect_timeout without a packet and form a new primary
# component without it. 3 s keeps a writer's failover inside the web's 5 s answer; the defaults (5 s, 15 s) are for
# networks that hiccup. gcache keeps enough write sets for a node back within minutes to catch up by IST, not SST.
# pc.recovery lets nodes that all crashed form their primary component again by themselves from gvwstate.dat.
wsrep_provider_options="gmcast.listen_addr=tcp://$ip:$((GALERA_BASE_PORT + n));ist.recv_addr=$ip:$((IST_BASE_PORT + n));gcache.size=128M;evs.keepalive_period=PT1S;evs.suspect_timeout=PT3S;evs.inactive_check_period=PT1S;evs.inactive_timeout=PT6S;evs.install_timeout=PT6S;pc.recovery=TRUE"
EOF
}

# The pids of the cluster in DIR that run: its nodes, health checker and endpoint, by their pid files.
own_pids() {
  local dir=$1 n
  for n in "${NODES[@]}"; do node_pid "$dir" "$n" || true; done
  pid_of "$dir/health.pid" || true
  pid_of "$dir/haproxy.pid" || true
}

# Whether process PID belongs to the cluster in DIR: one of its pid files' or a descendant of one, or a process whose
# command names a file under DIR (a joiner's rsync daemon, during a state transfer, names its config there).
own_process() {
  local dir=$1 pid=$2 own
  own=" $(own_pids "$dir" | tr '\n' ' ') "
  while [ -n "$pid" ] && [ "$pid" -gt 1 ]; do
    [[ $own == *" $pid "* ]] && return 0
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$dir/" && return 0
    pid=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f2) || return 1
  done
  return 1
}

# The pids listening on TCP PORT where a connection to ADDRESS reaches them (that address, or all of the machine's),
# one a line; "?" for a listener ss does not name the process of.
listeners() {
  local address=$1 port=$2 line local_address pids
  while read -r line; do
    [ -n "$line" ] || continue
    local_address=$(awk '{print $4}' <<<"$line")
    local_address=${local_address%:*}
    local_address=${local_address%%%*}
    case "$local_address" in
      "$address" | 0.0.0.0 | "*" | "[::]" | "[::ffff:$address]") ;;
      *) continue ;;
    esac
    pids=$(grep -o 'pid=[0-9]*' <<<"$line" | cut -d= -f2 | sort -u || true)
    echo "${pids:-?}"
  done < <(ss -tlnpH "( sport = :$port )")
}

describe_pid() {
  if [ "$1" = "?" ]; then
    echo "a process ss does not name"
  else
    echo "pid $1: $(tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | cut -c1-200)"
  fi
}

node_ports() {
  local n=$1 ip
  ip=$(address "$n")
  echo "$ip $((BASE_PORT + n)) gal$n's MySQL port"
  echo "$ip $((GALERA_BASE_PORT + n)) gal$n's Galera replication port"
  echo "$ip $((IST_BASE_PORT + n)) gal$n's incremental state transfer port"
  echo "$ip $((SST_BASE_PORT + n)) gal$n's full state transfer port"
}

endpoint_ports() {
  local n
  for n in "${NODES[@]}"; do echo "127.0.0.1 $((CHECK_BASE_PORT + n)) gal$n's health check"; done
  echo "127.0.0.1 $ENDPOINT_PORT the endpoint"
}

# Fail, naming each holder, when a process other than the cluster's own listens where it is to listen (lines of
# "ADDRESS PORT WHAT" on stdin): its clients would reach a server this cluster did not start.
refuse_taken() {
  local dir=$1 address port what pid taken=()
  while read -r address port what; do
    for pid in $(listeners "$address" "$port"); do
      [ "$pid" != "?" ] && own_process "$dir" "$pid" && continue
      taken+=("$address:$port ($what) is taken by $(describe_pid "$pid")")
    done
  done
  [ ${#taken[@]} -eq 0 ] && return
  echo "not starting: another process listens where the cluster in $dir would:" >&2
  printf '  %s\n' "${taken[@]}" >&2
  echo "stop it, or give this cluster other addresses and ports (GALERA_CLUSTER_ADDRESS_PREFIX, GALERA_CLUSTER_*_PORT)" >&2
  exit 1
}

prepare() {
  local dir=$1
  for n in "${NODES[@]}"; do write_node_config "$dir" "$n"; done
  write_endpoint_config "$dir"
}

pid_of() {
  local pid
  pid=$(cat "$1" 2>/dev/null) && [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

# Whether PID runs: a child that exited stays a zombie until this shell reaps it, and a zombie answers kill -0.
running() { [ -r "/proc/$1/stat" ] && [ "$(sed 's/.*) //' "/proc/$1/stat" | cut -d' ' -f1)" != Z ]; }

node_pid() { pid_of "$1/gal$2/mysqld.pid" || pid_of "$1/gal$2/launcher.pid"; }

node_sql() {
  local n=$1
  shift
  timeout 5 mysql --no-defaults -uroot -h"$(address "$n")" -P$((BASE_PORT + n)) --connect-timeout=2 -N -B -e "$@"
}

node_status() { node_sql "$1" "SHOW GLOBAL STATUS LIKE '$2'" 2>/dev/null | awk '{print $2}'; }

# Whether node N's data directory holds a cluster state it may start a new primary component from.
safe_to_bootstrap() { grep -q '^safe_to_bootstrap: *1' "$1/gal$2/data/grastate.dat" 2>/dev/null; }

start_node() {
  local dir=$1 n=$2 bootstrap=${3:-} node_dir="$1/gal$2"
  if node_pid "$dir" "$n" >/dev/null; then
    echo "gal$n already running (pid $(node_pid "$dir" "$n"))"
    return
  fi
  mkdir -p "$node_dir/data" "$node_dir/tmp"
  [ "$(id -u)" -eq 0 ] && chown "$RUN_AS:" "$node_dir/tmp"
  if [ -n "$bootstrap" ] && [ ! -d "$node_dir/data/mysql" ]; then
    mariadb-install-db --no-defaults --datadir="$node_dir/data" --tmpdir="$node_dir/tmp" \
      --auth-root-authentication-method=normal \
      --skip-test-db $([ "$(id -u)" -eq 0 ] && echo "--user=$RUN_AS") >"$node_dir/install.log" 2>&1 \
      || { echo "gal$n: mariadb-install-db failed; see $node_dir/install.log" >&2; exit 1; }
  fi
  rm -f "$node_dir/mysqld.pid"
  [ "$(id -u)" -eq 0 ] && chown -R "$RUN_AS:" "$node_dir"
  setsid mariadbd --defaults-file="$node_dir/my.cnf" ${bootstrap:+--wsrep-new-cluster} \
    >>"$node_dir/stdout.log" 2>&1 </dev/null &
  echo $! >"$node_dir/launcher.pid"
}

await_node() {
  local dir=$1 n=$2 state
  for _ in $(seq $((START_TIMEOUT * 2))); do
    if ! node_pid "$dir" "$n" >/dev/null; then
      echo "gal$n exited while starting:" >&2
      tail -n 5 "$dir/gal$n/error.log" >&2
      exit 1
    fi
    state=$(node_status "$n" wsrep_local_state || true)
    [ "$state" = 4 ] && { echo "gal$n synced (pid $(node_pid "$dir" "$n"), port $((BASE_PORT + n)))"; return; }
    sleep 0.5
  done
  echo "gal$n not Synced within ${START_TIMEOUT}s (state ${state:-none}); see $dir/gal$n/error.log" >&2
  exit 1
}

database_url() { echo "mysql://root:@127.0.0.1:$ENDPOINT_PORT/$DATABASE"; }

signal_pid() {
  local name=$1 pid=$2 signal=$3
  kill "-$signal" "$pid"
  for _ in $(seq 240); do kill -0 "$pid" 2>/dev/null || { echo "$name stopped ($signal)"; return 0; }; sleep 0.5; done
  echo "$name (pid $pid) still running after SIG$signal" >&2
  return 1
}

signal_node() {
  local dir=$1 n=$2 signal=$3 pid
  pid=$(node_pid "$dir" "$n") || { echo "gal$n is not running"; return 0; }
  signal_pid "gal$n" "$pid" "$signal"
}

status() {
  local dir=$1 n size primary=0
  for n in "${NODES[@]}"; do
    if ! node_pid "$dir" "$n" >/dev/null; then
      echo "gal$n: not running"
      continue
    fi
    local line
    line=$(node_sql "$n" "SELECT MAX(IF(VARIABLE_NAME='WSREP_CLUSTER_STATUS', VARIABLE_VALUE, NULL)),
      MAX(IF(VARIABLE_NAME='WSREP_CLUSTER_SIZE', VARIABLE_VALUE, NULL)),
      MAX(IF(VARIABLE_NAME='WSREP_LOCAL_STATE_COMMENT', VARIABLE_VALUE, NULL)),
      MAX(IF(VARIABLE_NAME='WSREP_READY', VARIABLE_VALUE, NULL))
      FROM information_schema.GLOBAL_STATUS" 2>/dev/null) || line=""
    if [ -z "$line" ]; then
      echo "gal$n: running (pid $(node_pid "$dir" "$n")), not answering"
      continue
    fi
    IFS=$'\t' read -r cluster size state ready <<<"$line"
    echo "gal$n: $cluster, $state, wsrep_ready=$ready, component of $size"
    [ "$cluster" = Primary ] && [ "$size" -gt "$primary" ] && primary=$size
  done
  echo "primary component: $primary of ${#NODES[@]} nodes"
  local current=""
  [ -S "$dir/haproxy.sock" ] && current=$(writer "$dir")
  echo "writer: ${current:+gal}${current:-none}"
}

command=${1:-}
dir=${2:-}
[ -n "$command" ] && [ -n "$dir" ] || usage
dir=$(mkdir -p "$dir" && cd "$dir" && pwd)
if [ "$(id -u)" -eq 0 ] && ! runuser -u "$RUN_AS" -- test -x "$dir"; then
  echo "$RUN_AS cannot reach $dir (a parent directory is private): choose a directory it can traverse" >&2
  exit 1
fi

case "$command" in
  start)
    prepare "$dir"
    { for n in "${NODES[@]}"; do node_ports "$n"; done; endpoint_ports; } | refuse_taken "$dir"
    check_health_checker
    running=()
    for n in "${NODES[@]}"; do node_pid "$dir" "$n" >/dev/null && running+=("$n"); done
    if [ ${#running[@]} -eq 0 ]; then
      # A new primary component starts from one node: a fresh cluster's first, or the node that left last (the
      # only one marked safe to bootstrap). After every node crashed none is marked: they start together and form
      # their component again from their saved view (pc.recovery).
      first=""
      [ -d "$dir/gal1/data/mysql" ] || first=1
      for n in "${NODES[@]}"; do [ -z "$first" ] && safe_to_bootstrap "$dir" "$n" && first=$n; done
      if [ -n "$first" ]; then
        start_node "$dir" "$first" bootstrap
        await_node "$dir" "$first"
      else
        for n in "${NODES[@]}"; do start_node "$dir" "$n"; done
      fi
    fi
    # One joiner at a time: each may need a full state transfer from a donor.
    for n in "${NODES[@]}"; do
      node_pid "$dir" "$n" >/dev/null && [ "$n" = "${first:-}" ] && continue
      start_node "$dir" "$n"
      await_node "$dir" "$n"
    done
    start_endpoint "$dir"
    database_url
    ;;
  stop)
    for name in haproxy health; do
      pid=$(pid_of "$dir/$name.pid") && signal_pid "$name" "$pid" TERM
    done
    # One at a time, the first node last: the last to leave is the one marked safe to start the cluster again.
    for n in 3 2 1; do signal_node "$dir" "$n" TERM; done
    ;;
  start-endpoint)
    write_endpoint_config "$dir"
    endpoint_ports | refuse_taken "$dir"
    start_endpoint "$dir"
    ;;
  status) status "$dir" ;;
  database-url) database_url ;;
  start-node)
    n=${3:?node number}
    write_node_config "$dir" "$n"
    node_ports "$n" | refuse_taken "$dir"
    others=0
    for m in "${NODES[@]}"; do [ "$m" != "$n" ] && node_pid "$dir" "$m" >/dev/null && others=1; done
    if [ "$others" = 0 ] && safe_to_bootstrap "$dir" "$n"; then start_node "$dir" "$n" bootstrap; else start_node "$dir" "$n"; fi
    await_node "$dir" "$n"
    ;;
  kill-node) signal_node "$dir" "${3:?node number}" KILL ;;
  stop-node) signal_node "$dir" "${3:?node number}" TERM ;;
  pid) node_pid "$dir" "${3:?node number}" ;;
  writer) w=$(writer "$dir"); [ -n "$w" ] || { echo "no healthy node" >&2; exit 1; }; echo "$w" ;;
  bootstrap-node)
    # Nodes that crashed leave the survivors' component without a majority of the last primary one, and it stays
    # non-primary (refusing writes) even when one of them comes back: only all of them returning restores it by
    # itself. The operator who knows the missing nodes are down, not cut off, tells a survivor to go on alone.
    n=${3:?node number}
    node_sql "$n" "SET GLOBAL wsrep_provider_options='pc.bootstrap=YES'"
    echo "gal$n: $(node_status "$n" wsrep_cluster_status)"
    ;;
  node-url) n=${3:?node number}; echo "mysql://root:@$(address "$n"):$((BASE_PORT + n))/$DATABASE" ;;
  *) usage ;;
esac
