#!/usr/bin/env bash
# Retention benchmark (not a test; figures go to docs/benchmarks.md):
#   1. "trimming": produce and consume at RATE messages/s of SIZE bytes for SECS seconds with
#      default retention (0/0: a ledger goes once consumed); the data directory is sampled
#      every 5 s and its largest size is the figure to hold under the stated bound.
#   2. "no-trimming": the same load for AB_SECS seconds with retention passes turned off
#      (retention_check_interval_seconds = 1 day): publish latency without trimming.
#   2b. "ab": AB_ROUNDS rounds of AB_SECS with trimming and AB_SECS without, alternating which
#      goes first, each on a fresh server: publish p99 with against without, in equal windows
#      measured in turn (this machine's speed drifts by more than the difference sought).
#   3. "clear": a BACKLOG_MB backlog on a subscription, then `clear-backlog` (skip_all):
#      seconds from the admin call until the data directory is back under BOUND_MB
#      (default 2560: the current ledger, at most 2 GiB by default, plus a few segments).
# Usage: bench/retention.sh [--secs 1200] [--ab-secs 300] [--ab-rounds 3] [--rate 51200]
#                           [--size 1024] [--backlog-mb 10240] [--only trimming,ab,clear]
#                           (also: no-trimming)
# Needs target/release/magnetar (or MAGNETAR_BIN). STORAGE_TOML="key = value" goes to every
# server's [storage] section. Writes bench/results/retention-<date>/.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${MAGNETAR_BIN:-$ROOT/target/release/magnetar}
SECS=1200 AB_SECS=300 AB_ROUNDS=3 RATE=51200 SIZE=1024 BACKLOG_MB=10240 ONLY=trimming,ab,clear
while (( $# )); do
  case $1 in
    --secs) SECS=$2; shift 2 ;;
    --ab-secs) AB_SECS=$2; shift 2 ;;
    --ab-rounds) AB_ROUNDS=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --backlog-mb) BACKLOG_MB=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -x "$BIN" ] || { echo "build it first: cargo build --release -p magnetar" >&2; exit 1; }
OUT=$ROOT/bench/results/retention-$(date +%Y%m%d-%H%M%S)
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/magnetar-retention-XXXXXX)
SERVER_PID=
SAMPLER_PID=
cleanup() {
  [ -n "$SAMPLER_PID" ] && kill "$SAMPLER_PID" 2>/dev/null || true
  [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start_server NAME [extra TOML for [broker]]
start_server() {
  local name=$1 extra=${2:-}
  BPORT=$(free_port); WPORT=$(free_port)
  DATA=$WORK/$name
  mkdir -p "$DATA"
  printf '[broker]\n%s\n[storage]\n%s\n' "$extra" "${STORAGE_TOML:-}" > "$WORK/$name.toml"
  "$BIN" standalone --broker-port "$BPORT" --web-port "$WPORT" --data-dir "$DATA" \
    --config "$WORK/$name.toml" > "$OUT/$name.server.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 100); do
    curl -sf "http://127.0.0.1:$WPORT/admin/v2/brokers/health" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "server $name did not start" >&2; exit 1
}

# stop_server [NAME]: with a name, keeps the server's final /metrics as $OUT/NAME.metrics.
stop_server() {
  if [ -n "${1:-}" ]; then
    curl -s "http://127.0.0.1:$WPORT/metrics" > "$OUT/$1.metrics" || true
  fi
  kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true; SERVER_PID=
}

# Samples the data directory's size every 5 s into $OUT/NAME.du (seconds, bytes).
start_sampler() {
  local name=$1 t0; t0=$(date +%s)
  ( while :; do
      echo "$(( $(date +%s) - t0 )) $(du -sb "$DATA" 2>/dev/null | cut -f1)"
      sleep 5
    done ) > "$OUT/$name.du" &
  SAMPLER_PID=$!
}

stop_sampler() { kill "$SAMPLER_PID" 2>/dev/null || true; wait "$SAMPLER_PID" 2>/dev/null || true; SAMPLER_PID=; }

max_mb() { awk 'BEGIN{m=0} {if ($2>m) m=$2} END{printf "%.0f", m/1048576}' "$1"; }

e2e() {  # e2e NAME SECONDS
  "$BIN" perf e2e -u "pulsar://127.0.0.1:$BPORT" --admin-url "http://127.0.0.1:$WPORT" \
    -r "$RATE" -s "$SIZE" -d "$2" --json "persistent://public/default/retention-$1" \
    > "$OUT/$1.json" 2> "$OUT/$1.perf.log"
}

summary() {
  python3 - "$OUT/$1.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
def find(o, *keys):
    for k in keys:
        if isinstance(o, dict) and k in o: return o[k]
    return None
print(json.dumps(d)[:600])
EOF
}

if [[ ,$ONLY, == *,trimming,* ]]; then
  echo "== trimming: ${SECS}s at $RATE msg/s x $SIZE B, default retention"
  start_server trimming
  start_sampler trimming
  e2e trimming "$SECS"
  stop_sampler
  echo "max data dir: $(max_mb "$OUT/trimming.du") MiB; final: $(du -sm "$DATA" | cut -f1) MiB"
  summary trimming
  stop_server trimming; rm -rf "$DATA"
fi

if [[ ,$ONLY, == *,no-trimming,* ]]; then
  echo "== no-trimming: ${AB_SECS}s, retention passes off"
  start_server no-trimming "retention_check_interval_seconds = 86400"
  start_sampler no-trimming
  e2e no-trimming "$AB_SECS"
  stop_sampler
  echo "max data dir: $(max_mb "$OUT/no-trimming.du") MiB"
  summary no-trimming
  stop_server no-trimming; rm -rf "$DATA"
fi

if [[ ,$ONLY, == *,ab,* ]]; then
  echo "== ab: $AB_ROUNDS rounds of ${AB_SECS}s with and without trimming, alternated"
  for round in $(seq 1 "$AB_ROUNDS"); do
    if (( round % 2 )); then order="trimming no-trimming"; else order="no-trimming trimming"; fi
    for case in $order; do
      extra=""
      if [ "$case" = no-trimming ]; then extra="retention_check_interval_seconds = 86400"; fi
      start_server "ab-$case-$round" "$extra"
      start_sampler "ab-$case-$round"
      e2e "ab-$case-$round" "$AB_SECS"
      stop_sampler
      echo "round $round $case: max data dir $(max_mb "$OUT/ab-$case-$round.du") MiB"
      stop_server "ab-$case-$round"; rm -rf "$DATA"
    done
  done
  python3 - "$OUT" "$AB_ROUNDS" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
for case in ("trimming", "no-trimming"):
    rows = []
    for r in range(1, rounds + 1):
        d = json.load(open("%s/ab-%s-%d.json" % (out, case, r)))
        publish = next(s for s in d["streams"] if s["latency"] and "publish" in s["name"])
        lat = publish["latency"]
        rows.append((lat["p50_us"] / 1e3, lat["p99_us"] / 1e3, lat["p999_us"] / 1e3,
                     publish["msg_per_s"], publish["errors"]))
    print("%-12s p99 ms per round %s (median %.3f); p50 median %.3f; p99.9 median %.3f; "
          "msg/s %s; errors %d" % (
              case, [round(x[1], 3) for x in rows], statistics.median(x[1] for x in rows),
              statistics.median(x[0] for x in rows), statistics.median(x[2] for x in rows),
              [round(x[3]) for x in rows], sum(x[4] for x in rows)))
EOF
fi

if [[ ,$ONLY, == *,clear,* ]]; then
  echo "== clear: ${BACKLOG_MB} MiB backlog, then clear-backlog"
  start_server clear
  topic=persistent://public/default/retention-clear
  count=$(( BACKLOG_MB * 1048576 / SIZE ))
  # The subscription exists first, so the backlog is kept for it.
  "$BIN" perf consume -u "pulsar://127.0.0.1:$BPORT" --subscriptions backlog -m 1 -d 2 "$topic" \
    > /dev/null 2>&1 || true
  "$BIN" perf produce -u "pulsar://127.0.0.1:$BPORT" -s "$SIZE" -m "$count" "$topic" \
    > "$OUT/clear.produce.log" 2>&1
  echo "backlog on disk: $(du -sm "$DATA" | cut -f1) MiB"
  # pulsar-admin topics clear-backlog -s backlog (Pulsar's REST path)
  t0=$(date +%s.%N)
  curl -sf -X POST \
    "http://127.0.0.1:$WPORT/admin/v2/persistent/public/default/retention-clear/subscription/backlog/skip_all" \
    || { echo "clear-backlog failed" >&2; exit 1; }
  start_sampler clear
  # Bound: the current ledger (at most max_bytes_per_ledger, 2 GiB by default) plus the spare
  # and a few 64 MiB journal segments.
  bound_mb=${BOUND_MB:-2560}
  while (( $(du -sm "$DATA" | cut -f1) > bound_mb )); do
    sleep 1
    if (( $(echo "$(date +%s.%N) - $t0 > 300" | bc) )); then echo "not under ${bound_mb} MiB after 300 s"; break; fi
  done
  stop_sampler
  echo "cleared; data dir under ${bound_mb} MiB after $(echo "$(date +%s.%N) - $t0" | bc) s (now $(du -sm "$DATA" | cut -f1) MiB)"
  stop_server; rm -rf "$DATA"
fi
echo "results in $OUT"
