#!/usr/bin/env bash
# A local Magnetar cluster in one command: etcd on loopback (its data in /dev/shm, or a temp dir
# where there is no /dev/shm), `magnetar metadata init`, three storage nodes (`magnetar
# storage`), then N brokers (`magnetar broker`) on that etcd with their ledgers on the nodes
# (each entry on 2 of them, acknowledged once both have it on disk), sharing the topics by
# namespace bundle. Prints every broker's URLs; Ctrl-C (or SIGTERM) stops the brokers, the nodes
# and etcd, by PID, and removes their data.
#
#   scripts/cluster-demo.sh [--brokers N] [--cluster NAME] [--etcd-port P] [--broker-port P]
#                           [--web-port P] [--storage-port P] [--storage-nodes N]
#
# Defaults: 1 broker, cluster "demo", etcd on 2379 (peer port: etcd port + 1), brokers on 6650,
# 6651, ... with their admin APIs on 8080, 8081, ...; storage nodes on 3181, 3182, 3183;
# --storage-nodes 0 keeps a single broker's ledgers on its own disk. Needs etcd (Debian:
# apt-get install etcd-server; or ETCD_BIN=/path/to/etcd). Uses target/release/magnetar
# (MAGNETAR_BIN overrides), built with cargo when missing.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CLUSTER=demo
ETCD_PORT=2379
BROKER_PORT=6650
WEB_PORT=8080
STORAGE_PORT=3181
STORAGE_NODES=3
BROKERS=1
START_TIMEOUT_S=60

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case $1 in
    --brokers) BROKERS=$2; shift 2 ;;
    --cluster) CLUSTER=$2; shift 2 ;;
    --etcd-port) ETCD_PORT=$2; shift 2 ;;
    --broker-port) BROKER_PORT=$2; shift 2 ;;
    --web-port) WEB_PORT=$2; shift 2 ;;
    --storage-port) STORAGE_PORT=$2; shift 2 ;;
    --storage-nodes) STORAGE_NODES=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "cluster-demo: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
PEER_PORT=$((ETCD_PORT + 1))
case $STORAGE_NODES in
  0|1|2|3|4|5|6|7|8|9) ;;
  *) echo "cluster-demo: --storage-nodes takes 0 to 9" >&2; exit 2 ;;
esac
case $BROKERS in
  1|2|3|4|5|6|7|8|9) ;;
  *) echo "cluster-demo: --brokers takes 1 to 9" >&2; exit 2 ;;
esac
if [ "$BROKERS" -gt 1 ] && [ "$STORAGE_NODES" -eq 0 ]; then
  echo "cluster-demo: several brokers share topics through storage nodes: --storage-nodes >= 1" >&2
  exit 2
fi

ETCD=${ETCD_BIN:-$(command -v etcd || true)}
if [ -z "$ETCD" ] || [ ! -x "$ETCD" ]; then
  echo "cluster-demo: etcd not found (Debian: apt-get install etcd-server; or set ETCD_BIN)" >&2
  exit 1
fi
BIN=${MAGNETAR_BIN:-$ROOT/target/release/magnetar}
if [ ! -x "$BIN" ]; then
  echo "cluster-demo: building $BIN"
  (cd "$ROOT" && cargo build --release -p magnetar)
fi

if [ -d /dev/shm ] && [ -w /dev/shm ]; then
  WORK=$(mktemp -d /dev/shm/magnetar-cluster-demo.XXXXXX)
else
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/magnetar-cluster-demo.XXXXXX")
fi
ETCD_PID=
BROKER_PIDS=()
STORAGE_PIDS=()

# Stops what this script started (by PID, brokers first), removes the data, exits with $1.
stop_all() {
  local code=$1
  trap - INT TERM EXIT
  local pid
  for pid in "${BROKER_PIDS[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      echo "cluster-demo: stopping broker (pid $pid)"
      kill -TERM "$pid" 2>/dev/null || true
    fi
  done
  for pid in "${BROKER_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  for pid in "${STORAGE_PIDS[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      echo "cluster-demo: stopping storage node (pid $pid)"
      kill -TERM "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
  if [ -n "$ETCD_PID" ] && kill -0 "$ETCD_PID" 2>/dev/null; then
    echo "cluster-demo: stopping etcd (pid $ETCD_PID)"
    kill -TERM "$ETCD_PID" 2>/dev/null || true
    wait "$ETCD_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
  echo "cluster-demo: stopped, $WORK removed"
  exit "$code"
}
trap 'stop_all 0' INT TERM
trap 'stop_all $?' EXIT

# http_status PORT PATH: the HTTP status of GET PATH on 127.0.0.1:PORT ("" if nothing answers).
http_status() {
  (
    exec 2>/dev/null
    exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 0
    printf 'GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' "$2" >&3
    read -r -t 5 _ status _ <&3 && echo "$status"
  ) || true
}

ETCD_URL=http://127.0.0.1:$ETCD_PORT
"$ETCD" --name demo --data-dir "$WORK/etcd" \
  --listen-client-urls "$ETCD_URL" --advertise-client-urls "$ETCD_URL" \
  --listen-peer-urls "http://127.0.0.1:$PEER_PORT" \
  --initial-advertise-peer-urls "http://127.0.0.1:$PEER_PORT" \
  --initial-cluster "demo=http://127.0.0.1:$PEER_PORT" \
  >"$WORK/etcd.log" 2>&1 &
ETCD_PID=$!
echo "cluster-demo: etcd pid $ETCD_PID on $ETCD_URL (data and logs in $WORK)"

# metadata init waits for etcd itself (its connect timeout), so no separate wait is needed.
"$BIN" metadata init --metadata "etcd://127.0.0.1:$ETCD_PORT" --cluster "$CLUSTER" \
  --web-service-url "http://127.0.0.1:$WEB_PORT" \
  --broker-service-url "pulsar://127.0.0.1:$BROKER_PORT" \
  || { echo "cluster-demo: metadata init failed; etcd log: $WORK/etcd.log" >&2; tail -5 "$WORK/etcd.log" >&2; exit 1; }

# Storage nodes: each prints "storage node ID listening on ADDRESS" once registered in etcd.
for ((i = 0; i < STORAGE_NODES; i++)); do
  NO_COLOR=1 "$BIN" storage --metadata "etcd://127.0.0.1:$ETCD_PORT" --cluster "$CLUSTER" \
    --listen "127.0.0.1:$((STORAGE_PORT + i))" --data-dir "$WORK/storage-$i" \
    >"$WORK/storage-$i.out" 2>"$WORK/storage-$i.log" &
  STORAGE_PIDS+=($!)
done
deadline=$((SECONDS + START_TIMEOUT_S))
for ((i = 0; i < STORAGE_NODES; i++)); do
  until grep -q "listening on" "$WORK/storage-$i.out" 2>/dev/null; do
    if ! kill -0 "${STORAGE_PIDS[$i]}" 2>/dev/null || [ $SECONDS -ge $deadline ]; then
      echo "cluster-demo: storage node $i did not start:" >&2
      tail -20 "$WORK/storage-$i.log" >&2
      exit 1
    fi
    sleep 0.1  # polling another process's start-up: there is no event to wait on
  done
  echo "cluster-demo: $(cat "$WORK/storage-$i.out") (pid ${STORAGE_PIDS[$i]})"
done

# The broker keeps its ledgers on the nodes: each entry on two of them (one with a single node).
QUORUM=$(( STORAGE_NODES >= 2 ? 2 : 1 ))
if [ "$STORAGE_NODES" -gt 0 ]; then
  printf '[ledgers]\nstorage = "nodes"\nensemble_size = %d\nwrite_quorum = %d\nack_quorum = %d\n' \
    "$QUORUM" "$QUORUM" "$QUORUM" >"$WORK/broker.toml"
else
  : >"$WORK/broker.toml"
fi
for ((i = 0; i < BROKERS; i++)); do
  NO_COLOR=1 "$BIN" broker --metadata "etcd://127.0.0.1:$ETCD_PORT" --cluster "$CLUSTER" \
    --config "$WORK/broker.toml" --data-dir "$WORK/broker-$i-data" \
    --broker-port "$((BROKER_PORT + i))" --web-port "$((WEB_PORT + i))" \
    >"$WORK/broker-$i.log" 2>&1 &
  BROKER_PIDS+=($!)
  echo "cluster-demo: broker $i pid ${BROKER_PIDS[$i]} (log: $WORK/broker-$i.log)"
done

deadline=$((SECONDS + START_TIMEOUT_S))
for ((i = 0; i < BROKERS; i++)); do
  until [ "$(http_status "$((WEB_PORT + i))" /admin/v2/brokers/ready)" = 200 ]; do
    if ! kill -0 "${BROKER_PIDS[$i]}" 2>/dev/null; then
      echo "cluster-demo: broker $i exited during start-up:" >&2
      tail -20 "$WORK/broker-$i.log" >&2
      exit 1
    fi
    if [ $SECONDS -ge $deadline ]; then
      echo "cluster-demo: broker $i was not ready after ${START_TIMEOUT_S}s:" >&2
      tail -20 "$WORK/broker-$i.log" >&2
      exit 1
    fi
    sleep 0.2  # polling another process's start-up: there is no event to wait on
  done
done

SERVICE_URL=pulsar://127.0.0.1:$BROKER_PORT
for ((i = 1; i < BROKERS; i++)); do SERVICE_URL+=",127.0.0.1:$((BROKER_PORT + i))"; done
echo "cluster-demo: ready. Cluster \"$CLUSTER\", $BROKERS broker(s):"
for ((i = 0; i < BROKERS; i++)); do
  echo "  broker $i  pulsar://127.0.0.1:$((BROKER_PORT + i))  admin http://127.0.0.1:$((WEB_PORT + i))  (pid ${BROKER_PIDS[$i]})"
done
cat <<EOF
  service URL      $SERVICE_URL   (any broker answers lookups for every topic)
  brokers          http://127.0.0.1:$WEB_PORT/admin/v2/brokers/$CLUSTER
  etcd             $ETCD_URL   (keys under /magnetar/$CLUSTER)
  storage nodes    $STORAGE_NODES on 127.0.0.1:$STORAGE_PORT...   (registrations: /magnetar/$CLUSTER/storage-nodes)
Try:  $BIN perf produce -u pulsar://127.0.0.1:$BROKER_PORT --admin-url http://127.0.0.1:$WEB_PORT -s 128 -d 10
Ctrl-C stops the brokers, the storage nodes and etcd and removes $WORK.
EOF

# Until Ctrl-C / SIGTERM (the trap stops everything). A broker that exits (or is killed, to
# watch its topics move) is reported; the rest carry on until none is left.
running=("${!BROKER_PIDS[@]}")
while [ ${#running[@]} -gt 0 ]; do
  pids=()
  for i in "${running[@]}"; do pids+=("${BROKER_PIDS[$i]}"); done
  wait -n "${pids[@]}" 2>/dev/null || true
  still=()
  for i in "${running[@]}"; do
    if kill -0 "${BROKER_PIDS[$i]}" 2>/dev/null; then
      still+=("$i")
    else
      echo "cluster-demo: broker $i (pid ${BROKER_PIDS[$i]}) exited; its log's end:" >&2
      tail -5 "$WORK/broker-$i.log" >&2
    fi
  done
  running=("${still[@]}")
done
echo "cluster-demo: every broker exited" >&2
exit 1
