#!/usr/bin/env bash
# A local Magnetar cluster in one command: etcd on loopback (its data in /dev/shm, or a temp dir
# where there is no /dev/shm), `magnetar metadata init`, three storage nodes (`magnetar
# storage`), then `magnetar broker` on that etcd with its ledgers on the nodes (each entry on 2
# of them, acknowledged once both have it on disk). Prints how to connect; Ctrl-C (or SIGTERM)
# stops the broker, the nodes and etcd and removes their data.
#
#   scripts/cluster-demo.sh [--cluster NAME] [--etcd-port P] [--broker-port P] [--web-port P]
#                           [--storage-port P] [--storage-nodes N]
#
# Defaults: cluster "demo", etcd on 2379 (peer port: etcd port + 1), broker on 6650, admin API
# on 8080, storage nodes on 3181, 3182, 3183; --storage-nodes 0 keeps the broker's ledgers on its
# own disk. Needs etcd (Debian: apt-get install etcd-server; or ETCD_BIN=/path/to/etcd). Uses
# target/release/magnetar (MAGNETAR_BIN overrides), built with cargo when missing.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CLUSTER=demo
ETCD_PORT=2379
BROKER_PORT=6650
WEB_PORT=8080
STORAGE_PORT=3181
STORAGE_NODES=3
START_TIMEOUT_S=60

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case $1 in
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
BROKER_PID=
STORAGE_PIDS=()

# Stops what this script started (by PID, broker first), removes the data, exits with $1.
stop_all() {
  local code=$1
  trap - INT TERM EXIT
  if [ -n "$BROKER_PID" ] && kill -0 "$BROKER_PID" 2>/dev/null; then
    echo "cluster-demo: stopping the broker (pid $BROKER_PID)"
    kill -TERM "$BROKER_PID" 2>/dev/null || true
    wait "$BROKER_PID" 2>/dev/null || true
  fi
  local pid
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
NO_COLOR=1 "$BIN" broker --metadata "etcd://127.0.0.1:$ETCD_PORT" --cluster "$CLUSTER" \
  --config "$WORK/broker.toml" \
  --data-dir "$WORK/broker-data" --broker-port "$BROKER_PORT" --web-port "$WEB_PORT" \
  >"$WORK/broker.log" 2>&1 &
BROKER_PID=$!
echo "cluster-demo: broker pid $BROKER_PID (log: $WORK/broker.log)"

deadline=$((SECONDS + START_TIMEOUT_S))
until [ "$(http_status "$WEB_PORT" /admin/v2/brokers/ready)" = 200 ]; do
  if ! kill -0 "$BROKER_PID" 2>/dev/null; then
    echo "cluster-demo: the broker exited during start-up:" >&2
    tail -20 "$WORK/broker.log" >&2
    exit 1
  fi
  if [ $SECONDS -ge $deadline ]; then
    echo "cluster-demo: the broker was not ready after ${START_TIMEOUT_S}s:" >&2
    tail -20 "$WORK/broker.log" >&2
    exit 1
  fi
  sleep 0.2  # polling another process's start-up: there is no event to wait on
done

cat <<EOF
cluster-demo: ready. Cluster "$CLUSTER":
  Pulsar protocol  pulsar://127.0.0.1:$BROKER_PORT
  admin REST       http://127.0.0.1:$WEB_PORT   (brokers: /admin/v2/brokers/$CLUSTER)
  etcd             $ETCD_URL   (keys under /magnetar/$CLUSTER)
  storage nodes    $STORAGE_NODES on 127.0.0.1:$STORAGE_PORT...   (registrations: /magnetar/$CLUSTER/storage-nodes)
Try:  $BIN perf produce -u pulsar://127.0.0.1:$BROKER_PORT --admin-url http://127.0.0.1:$WEB_PORT -s 128 -d 10
Ctrl-C stops the broker, the storage nodes and etcd and removes $WORK.
EOF

# Until Ctrl-C / SIGTERM (the trap stops everything), or until the broker exits by itself.
wait "$BROKER_PID" || true
echo "cluster-demo: the broker exited; its log:" >&2
tail -20 "$WORK/broker.log" >&2
BROKER_PID=
exit 1
