#!/usr/bin/env bash
# Metrics cost benchmark (not a test; figures go to docs/benchmarks.md), issue 16:
#   1. publish with and without a scrape of GET /metrics every second, alternating
#      ROUNDS times in one run (this machine is noisy): async 128 B (batching on, as fast as
#      possible) and sync 1 KiB (one message in flight); throughput and p99 per mode;
#   2. TOPICS topics loaded (one message each), then: the time of a scrape (curl, 10 times),
#      its size, and sync 1 KiB publish p99 on another topic with and without a scrape every
#      second (does a big scrape hold up publishing?).
# Usage: bench/metrics.sh [--secs 20] [--rounds 3] [--topics 10000]
# Needs target/release/magnetar (or MAGNETAR_BIN) and curl. Writes bench/results/metrics-<date>/.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${MAGNETAR_BIN:-$ROOT/target/release/magnetar}
SECS=20 ROUNDS=3 TOPICS=10000
while (( $# )); do
  case $1 in
    --secs) SECS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --topics) TOPICS=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -x "$BIN" ] || { echo "build it first: cargo build --release -p magnetar" >&2; exit 1; }
OUT=$ROOT/bench/results/metrics-$(date +%Y%m%d-%H%M%S)
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/magnetar-metrics-XXXXXX)
BROKER_PORT=${BROKER_PORT:-26650} WEB_PORT=${WEB_PORT:-28080}
URL=pulsar://127.0.0.1:$BROKER_PORT
METRICS=http://127.0.0.1:$WEB_PORT/metrics
SERVER_PID= SCRAPER_PID=
cleanup() {
  [ -n "$SCRAPER_PID" ] && kill "$SCRAPER_PID" 2>/dev/null || true
  [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

"$BIN" standalone --broker-port "$BROKER_PORT" --web-port "$WEB_PORT" --data-dir "$WORK/data" \
  > "$OUT/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 100); do
  curl -fs "http://127.0.0.1:$WEB_PORT/admin/v2/brokers/ready" >/dev/null 2>&1 && break
  sleep 0.1
done

scraper_start() {
  ( while :; do curl -fs -o /dev/null "$METRICS" || true; sleep 1; done ) &
  SCRAPER_PID=$!
}
scraper_stop() { kill "$SCRAPER_PID" 2>/dev/null || true; wait "$SCRAPER_PID" 2>/dev/null || true; SCRAPER_PID=; }

# run NAME TOPIC perf-args...: one perf run, its JSON summary in $OUT/NAME.json
run() {
  local name=$1 topic=$2; shift 2
  "$BIN" perf produce -u "$URL" -d "$SECS" --json "$@" "$topic" > "$OUT/$name.json" 2>"$OUT/$name.log"
}

echo "== publish with and without a scrape every second ($ROUNDS rounds, ${SECS}s each)"
for round in $(seq "$ROUNDS"); do
  for mode in async128 sync1k; do
    case $mode in
      async128) args=(-s 128) ;;
      sync1k) args=(-s 1024 --sync) ;;
    esac
    # Which goes first alternates: the machine drifts within a round too.
    if (( round % 2 )); then order="plain scraped"; else order="scraped plain"; fi
    for kind in $order; do
      if [ "$kind" = scraped ]; then scraper_start; fi
      run "$mode-$kind-$round" "bench-$mode" "${args[@]}"
      if [ "$kind" = scraped ]; then scraper_stop; fi
    done
  done
done

echo "== $TOPICS topics"
"$BIN" perf produce -u "$URL" -t "$TOPICS" -m "$TOPICS" -s 128 --disable-batching \
  -o 1 many > "$OUT/load-topics.log" 2>&1
for i in $(seq 10); do
  curl -fs -o "$OUT/scrape.txt" -w '%{time_total}\n' "$METRICS"
done > "$OUT/scrape-seconds.txt"
run "many-sync1k-plain" bench-many -s 1024 --sync
scraper_start
run "many-sync1k-scraped" bench-many -s 1024 --sync
scraper_stop

python3 - "$OUT" "$ROUNDS" <<'PY'
import json, sys, os, statistics
out, rounds = sys.argv[1], int(sys.argv[2])
def load(name):
    with open(os.path.join(out, name + ".json")) as f:
        return json.load(f)
def fields(report):
    stream = report["streams"][0]
    return stream["msg_per_s"], stream["latency"]["p99_us"] / 1000.0
lines = []
for mode in ("async128", "sync1k"):
    for kind in ("plain", "scraped"):
        rates, p99s = [], []
        for r in range(1, rounds + 1):
            rate, p99 = fields(load("%s-%s-%d" % (mode, kind, r)))
            rates.append(rate); p99s.append(p99)
        lines.append("%-9s %-8s msg/s %s (median %.0f)  p99 ms %s (median %.3f)" % (
            mode, kind, [round(x) for x in rates], statistics.median(rates),
            [round(x, 3) for x in p99s], statistics.median(p99s)))
    # Paired within each round: scraped over plain.
    pairs = [(fields(load("%s-scraped-%d" % (mode, r))), fields(load("%s-plain-%d" % (mode, r))))
             for r in range(1, rounds + 1)]
    rate_ratios = [s[0] / p[0] for s, p in pairs]
    p99_ratios = [s[1] / p[1] for s, p in pairs]
    lines.append("%-9s scraped/plain per round: msg/s %s (median %.3f)  p99 %s (median %.3f)" % (
        mode, [round(x, 3) for x in rate_ratios], statistics.median(rate_ratios),
        [round(x, 3) for x in p99_ratios], statistics.median(p99_ratios)))
secs = [float(x) for x in open(os.path.join(out, "scrape-seconds.txt"))]
size = os.path.getsize(os.path.join(out, "scrape.txt"))
series = sum(1 for l in open(os.path.join(out, "scrape.txt")) if l and not l.startswith("#"))
lines.append("scrape: %d series, %.1f MiB, seconds %s (median %.3f, max %.3f)" % (
    series, size / 2**20, [round(x, 3) for x in secs], statistics.median(secs), max(secs)))
for kind in ("plain", "scraped"):
    rate, p99 = fields(load("many-sync1k-" + kind))
    lines.append("with many topics, sync1k %-8s msg/s %.0f p99 ms %.3f" % (kind, rate, p99))
text = "\n".join(lines)
print(text)
open(os.path.join(out, "summary.txt"), "w").write(text + "\n")
PY
echo "results: $OUT"
