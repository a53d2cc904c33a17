#!/usr/bin/env bash
# Authentication cost benchmark (not a test; figures go to docs/benchmarks.md), issue 17:
# publish to a broker with `[authentication]` off and to one with HS256 tokens on (the token is
# checked once, at CONNECT; nothing per message), alternating ROUNDS times in one run (this
# machine is noisy): async 128 B (batching on, as fast as possible) and sync 1 KiB (one message
# in flight); throughput and p99 per mode. Also the time of one CONNECT with a token (a new
# client per run of `magnetar perf produce -m 1`).
# Usage: bench/auth.sh [--secs 20] [--rounds 3]
# Needs target/release/magnetar and curl. Writes bench/results/auth-<date>/.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=$ROOT/target/release/magnetar
SECS=20 ROUNDS=3
while (( $# )); do
  case $1 in
    --secs) SECS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -x "$BIN" ] || { echo "build it first: cargo build --release -p magnetar" >&2; exit 1; }
OUT=$ROOT/bench/results/auth-$(date +%Y%m%d-%H%M%S)
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/magnetar-auth-bench-XXXXXX)
PLAIN_PORT=${PLAIN_PORT:-26650} PLAIN_WEB=${PLAIN_WEB:-28080}
AUTH_PORT=${AUTH_PORT:-26651} AUTH_WEB=${AUTH_WEB:-28081}
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

"$BIN" tokens create-secret-key --output "$WORK/secret.key"
TOKEN=$("$BIN" tokens create --secret-key "file://$WORK/secret.key" --subject bench)
printf '[authentication]\nenabled = true\ntoken_secret_key = "file://%s"\n' "$WORK/secret.key" \
  > "$WORK/auth.toml"

# start NAME BROKER_PORT WEB_PORT [--config F]: a standalone of its own, waited for
start() {
  local name=$1 port=$2 web=$3; shift 3
  "$BIN" standalone --broker-port "$port" --web-port "$web" --data-dir "$WORK/$name" "$@" \
    > "$OUT/server-$name.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do
    curl -fs -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$web/admin/v2/brokers/ready" \
      >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "$name did not start" >&2; exit 1
}
start plain "$PLAIN_PORT" "$PLAIN_WEB"
start auth "$AUTH_PORT" "$AUTH_WEB" --config "$WORK/auth.toml"

# run NAME URL perf-args...: one perf run, its JSON summary in $OUT/NAME.json
run() {
  local name=$1 url=$2; shift 2
  "$BIN" perf produce -u "$url" -d "$SECS" --json "$@" > "$OUT/$name.json" 2>"$OUT/$name.log"
}

echo "== publish with authentication off and on ($ROUNDS rounds, ${SECS}s each)"
for round in $(seq "$ROUNDS"); do
  for mode in async128 sync1k; do
    case $mode in
      async128) args=(-s 128) ;;
      sync1k) args=(-s 1024 --sync) ;;
    esac
    run "$mode-off-$round" "pulsar://127.0.0.1:$PLAIN_PORT" "${args[@]}" "bench-$mode"
    run "$mode-on-$round" "pulsar://127.0.0.1:$AUTH_PORT" "${args[@]}" --auth-token "$TOKEN" \
      "bench-$mode"
  done
done

echo "== connect + one message, 20 times each"
for kind in off on; do
  if [ "$kind" = on ]; then url=pulsar://127.0.0.1:$AUTH_PORT; auth=(--auth-token "$TOKEN");
  else url=pulsar://127.0.0.1:$PLAIN_PORT; auth=(); fi
  for _ in $(seq 20); do
    /usr/bin/time -f '%e' "$BIN" perf produce -u "$url" -m 1 --warmup-time 0 "${auth[@]}" \
      bench-connect > /dev/null 2>> "$OUT/connect-$kind.txt"
  done
done

python3 - "$OUT" "$ROUNDS" <<'PY'
import json, sys, os, statistics
out, rounds = sys.argv[1], int(sys.argv[2])
def fields(name):
    with open(os.path.join(out, name + ".json")) as f:
        stream = json.load(f)["streams"][0]
    return stream["msg_per_s"], stream["latency"]["p99_us"] / 1000.0
lines = []
for mode in ("async128", "sync1k"):
    for kind in ("off", "on"):
        rates, p99s = zip(*(fields("%s-%s-%d" % (mode, kind, r)) for r in range(1, rounds + 1)))
        lines.append("%-9s auth %-3s msg/s %s (median %.0f)  p99 ms %s (median %.3f)" % (
            mode, kind, [round(x) for x in rates], statistics.median(rates),
            [round(x, 3) for x in p99s], statistics.median(p99s)))
for kind in ("off", "on"):
    secs = []
    for line in open(os.path.join(out, "connect-%s.txt" % kind)):
        try:
            secs.append(float(line))
        except ValueError:
            pass
    if secs:
        lines.append("connect + 1 message, auth %-3s seconds: median %.3f max %.3f" % (
            kind, statistics.median(secs), max(secs)))
text = "\n".join(lines)
print(text)
open(os.path.join(out, "summary.txt"), "w").write(text + "\n")
PY
echo "results: $OUT"
