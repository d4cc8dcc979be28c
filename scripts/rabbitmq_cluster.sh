#!/usr/bin/env bash
# A three-node RabbitMQ cluster on one machine, beside any system RabbitMQ, for tests, the soak and trying it out.
#
#   scripts/rabbitmq_cluster.sh start DIR          start cs1..cs3 and cluster them (prints the CELERY_BROKER_URL)
#   scripts/rabbitmq_cluster.sh stop DIR           stop every node gracefully (SIGTERM by pid)
#   scripts/rabbitmq_cluster.sh status DIR         cluster_status as node cs1 (or the first running node) sees it
#   scripts/rabbitmq_cluster.sh broker-url DIR     the failover CELERY_BROKER_URL naming the three nodes
#   scripts/rabbitmq_cluster.sh start-node DIR N   start (or restart) node N (1..3); a restarted member rejoins by itself
#   scripts/rabbitmq_cluster.sh kill-node DIR N    SIGKILL node N: a crash, no goodbye to the cluster
#   scripts/rabbitmq_cluster.sh stop-node DIR N    SIGTERM node N: a graceful stop (queue leadership is handed over)
#   scripts/rabbitmq_cluster.sh await-quorum DIR N [SECONDS]  wait (default 120 s; fail after) until stopping node
#                                                 N leaves every quorum queue a majority online: before a planned
#                                                 stop, as a node restarted moments ago may not be back in its queues
#   scripts/rabbitmq_cluster.sh pid DIR N          the Erlang VM's pid of node N
#   scripts/rabbitmq_cluster.sh leader DIR QUEUE   the node leading a quorum queue
#   scripts/rabbitmq_cluster.sh ctl DIR N ARGS...  rabbitmqctl ARGS against node N (e.g. list_queues name type leader)
#
# Each node has its own name (csN@localhost), AMQP port (BASE_PORT+N, default 5701..5703), Erlang distribution port
# (DIST_BASE_PORT+N, 25701..25703), data, log and config under DIR/csN, no plugins (so no management listener
# clashes), and an Erlang cookie of its own in DIR/home: a cluster started here can never join, or be joined by,
# the system node. RABBITMQ_CLUSTER_SIZE=1 makes it a broker of one node, and RABBITMQ_CLUSTER_NAME another prefix
# than cs for the node names, which every node on the machine must have to itself (one test's private broker
# beside the three-node cluster). The recipe for real machines is the same: per node one rabbitmq.conf and one
# cookie shared by the cluster, then `rabbitmqctl join_cluster` on every node but the first.
set -euo pipefail

BASE_PORT=${RABBITMQ_CLUSTER_BASE_PORT:-5700}
DIST_BASE_PORT=${RABBITMQ_CLUSTER_DIST_BASE_PORT:-25700}
NAME=${RABBITMQ_CLUSTER_NAME:-cs}
mapfile -t NODES < <(seq "${RABBITMQ_CLUSTER_SIZE:-3}")
# The Debian package's wrappers under /usr/sbin switch to the rabbitmq user, whose HOME and cookie are the system
# node's; the scripts behind them run as whoever calls them.
RABBITMQ_BIN=${RABBITMQ_BIN:-/usr/lib/rabbitmq/bin}
START_TIMEOUT=${RABBITMQ_CLUSTER_START_TIMEOUT:-120}

usage() { sed -n '2,16p' "$0" >&2; exit 2; }

node_name() { echo "$NAME$1@localhost"; }

# Everything rabbitmq-server and rabbitmqctl read, for node $2 of cluster $1.
node_env() {
  local dir=$1 n=$2 node_dir="$1/$NAME$2"
  echo HOME="$dir/home" \
    RABBITMQ_NODENAME="$(node_name "$n")" \
    RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
    RABBITMQ_NODE_PORT=$((BASE_PORT + n)) \
    RABBITMQ_DIST_PORT=$((DIST_BASE_PORT + n)) \
    RABBITMQ_CONF_ENV_FILE="$dir/rabbitmq-env.conf" \
    RABBITMQ_CONFIG_FILE="$node_dir/rabbitmq.conf" \
    RABBITMQ_ADVANCED_CONFIG_FILE="$node_dir/advanced.config" \
    RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" \
    RABBITMQ_PLUGINS_EXPAND_DIR="$node_dir/plugins-expand" \
    RABBITMQ_FEATURE_FLAGS_FILE="$node_dir/feature_flags" \
    RABBITMQ_MNESIA_BASE="$node_dir/mnesia" \
    RABBITMQ_LOG_BASE="$node_dir/log" \
    RABBITMQ_PID_FILE="$node_dir/pid" \
    ERL_CRASH_DUMP="$node_dir/log/erl_crash.dump" \
    ERL_EPMD_ADDRESS=127.0.0.1 \
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="'-kernel inet_dist_use_interface {127,0,0,1}'"
}

ctl() {
  local dir=$1 n=$2
  shift 2
  eval env "$(node_env "$dir" "$n")" "$RABBITMQ_BIN/rabbitmqctl" -n "$(node_name "$n")" '"$@"'
}

await_quorum() {
  local dir=$1 n=$2 seconds=${3:-120}
  eval env "$(node_env "$dir" "$n")" "$RABBITMQ_BIN/rabbitmq-upgrade" -n "$(node_name "$n")" -q --timeout "$seconds" \
    await_online_quorum_plus_one
}

prepare() {
  local dir=$1
  mkdir -p "$dir/home"
  if [ ! -f "$dir/home/.erlang.cookie" ]; then
    head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/home/.erlang.cookie"
    chmod 400 "$dir/home/.erlang.cookie"
  fi
  : >"$dir/rabbitmq-env.conf"
  echo "[]." >"$dir/enabled_plugins"
  for n in "${NODES[@]}"; do
    mkdir -p "$dir/$NAME$n/log"
    cat >"$dir/$NAME$n/rabbitmq.conf" <<EOF
listeners.tcp.1 = 127.0.0.1:$((BASE_PORT + n))
# A node that sees a minority of the cluster stops serving clients, who fail over to the majority side.
cluster_partition_handling = pause_minority
EOF
  done
}

node_pid() {
  local pid_file="$1/$NAME$2/pid"
  local pid
  pid=$(cat "$pid_file" 2>/dev/null) && [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

start_node() {
  local dir=$1 n=$2
  if node_pid "$dir" "$n" >/dev/null; then
    echo "$NAME$n already running (pid $(node_pid "$dir" "$n"))"
    return
  fi
  rm -f "$dir/$NAME$n/pid"
  eval env "$(node_env "$dir" "$n")" setsid "$RABBITMQ_BIN/rabbitmq-server" \
    '>>"$dir/$NAME$n/log/stdout.log"' '2>&1' '</dev/null' '&'
  echo $! >"$dir/$NAME$n/launcher.pid"
}

await_node() {
  local dir=$1 n=$2
  # await_startup gives up at once while the VM has not registered its name yet: wait for its pid file first, and
  # stop waiting when the node died starting (a port or node name in use, say).
  for _ in $(seq $((START_TIMEOUT * 2))); do
    node_pid "$dir" "$n" >/dev/null && break
    if ! kill -0 "$(cat "$dir/$NAME$n/launcher.pid")" 2>/dev/null; then
      echo "$NAME$n exited while starting:" >&2
      tail -n 3 "$dir/$NAME$n/log/stdout.log" >&2
      exit 1
    fi
    sleep 0.5
  done
  if ! ctl "$dir" "$n" -q -t "$START_TIMEOUT" await_startup >/dev/null; then
    echo "$NAME$n did not start; see $dir/$NAME$n/log" >&2
    exit 1
  fi
  echo "$NAME$n up (pid $(node_pid "$dir" "$n"), amqp port $((BASE_PORT + n)))"
}

in_cluster() {
  ctl "$1" "$2" -q cluster_status --formatter json 2>/dev/null | grep -q "\"$(node_name 1)\""
}

broker_url() {
  local urls=()
  for n in "${NODES[@]}"; do urls+=("amqp://guest:guest@127.0.0.1:$((BASE_PORT + n))//"); done
  (IFS=';'; echo "${urls[*]}")
}

signal_node() {
  local dir=$1 n=$2 signal=$3 pid
  pid=$(node_pid "$dir" "$n") || { echo "$NAME$n is not running"; return 0; }
  kill "-$signal" "$pid"
  for _ in $(seq 120); do kill -0 "$pid" 2>/dev/null || { echo "$NAME$n stopped ($signal)"; return 0; }; sleep 0.5; done
  echo "$NAME$n (pid $pid) still running after SIG$signal" >&2
  return 1
}

command=${1:-}
dir=${2:-}
[ -n "$command" ] && [ -n "$dir" ] || usage
dir=$(mkdir -p "$dir" && cd "$dir" && pwd)

case "$command" in
  start)
    prepare "$dir"
    for n in "${NODES[@]}"; do start_node "$dir" "$n"; done
    for n in "${NODES[@]}"; do await_node "$dir" "$n"; done
    for n in "${NODES[@]:1}"; do
      in_cluster "$dir" "$n" && continue
      {
        ctl "$dir" "$n" -q stop_app
        ctl "$dir" "$n" -q reset
        ctl "$dir" "$n" -q join_cluster "$(node_name 1)"
        ctl "$dir" "$n" -q start_app
      } >>"$dir/$NAME$n/log/cli.log" 2>&1 || { echo "$NAME$n could not join; see $dir/$NAME$n/log/cli.log" >&2; exit 1; }
      echo "$NAME$n joined $(node_name 1)"
    done
    broker_url
    ;;
  stop)
    for n in "${NODES[@]}"; do signal_node "$dir" "$n" TERM; done
    ;;
  status)
    for n in "${NODES[@]}"; do
      node_pid "$dir" "$n" >/dev/null && { ctl "$dir" "$n" cluster_status; exit; }
    done
    echo "no node running" >&2
    exit 1
    ;;
  broker-url) broker_url ;;
  start-node) start_node "$dir" "${3:?node number}" && await_node "$dir" "$3" ;;
  kill-node) signal_node "$dir" "${3:?node number}" KILL ;;
  stop-node) signal_node "$dir" "${3:?node number}" TERM ;;
  await-quorum) await_quorum "$dir" "${3:?node number}" "${4:-120}" ;;
  pid) node_pid "$dir" "${3:?node number}" ;;
  ctl) n=${3:?node number}; shift 3; ctl "$dir" "$n" "$@" ;;
  leader)
    for n in "${NODES[@]}"; do
      if node_pid "$dir" "$n" >/dev/null; then
        ctl "$dir" "$n" -q list_queues name leader --no-table-headers | awk -v q="${3:?queue}" '$1 == q {print $2}'
        exit
      fi
    done
    exit 1
    ;;
  *) usage ;;
esac
