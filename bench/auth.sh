#!/usr/bin/env bash
# Authentication + authorization cost benchmark (not a test; figures go to docs/benchmarks.md),
# issue 17: two brokers side by side, one plain and one with `[authentication]` (HS256 token)
# and `[authorization]` on (the perf role has produce+consume on public/default, so each
# PRODUCER/SUBSCRIBE/LOOKUP is decided from the cached namespace document; SEND is never
# checked), measured in alternated rounds in one run (this machine is noisy):
#   async 128 B (batching on, as fast as possible): msg/s;
#   sync 1 KiB (one message in flight): msg/s, p50, p99.
# Usage: bench/auth.sh [--secs 20] [--rounds 3]
# Needs target/release/magnetar, curl and python3. Writes bench/results/auth-<date>/.
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
WORK=$(mktemp -d /tmp/magnetar-auth-XXXXXX)
PLAIN_BROKER=${PLAIN_BROKER:-26650} PLAIN_WEB=${PLAIN_WEB:-28080}
AUTH_BROKER=${AUTH_BROKER:-26651} AUTH_WEB=${AUTH_WEB:-28081}
PLAIN_PID= AUTH_PID=
cleanup() {
  [ -n "$PLAIN_PID" ] && kill "$PLAIN_PID" 2>/dev/null || true
  [ -n "$AUTH_PID" ] && kill "$AUTH_PID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# A secret key and two HS256 tokens (super-user `admin`, perf role `perf`), made with python3's
# standard library (no JWT package needed).
head -c 32 /dev/urandom > "$WORK/secret.key"
make_token() {
  python3 - "$WORK/secret.key" "$1" <<'PY'
import base64, hashlib, hmac, json, sys
secret, role = open(sys.argv[1], "rb").read(), sys.argv[2]
b = lambda d: base64.urlsafe_b64encode(d).rstrip(b"=").decode()
head = b(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
body = b(json.dumps({"sub": role}).encode())
sig = b(hmac.new(secret, ("%s.%s" % (head, body)).encode(), hashlib.sha256).digest())
print("%s.%s.%s" % (head, body, sig))
PY
}
make_token admin > "$WORK/admin.token"
make_token perf > "$WORK/perf.token"
cat > "$WORK/auth.toml" <<TOML
[authentication]
enabled = true
providers = ["token"]
token_secret_key = "file://$WORK/secret.key"

[authorization]
enabled = true
super_user_roles = ["admin"]
TOML

"$BIN" standalone --broker-port "$PLAIN_BROKER" --web-port "$PLAIN_WEB" \
  --data-dir "$WORK/plain" > "$OUT/server-plain.log" 2>&1 &
PLAIN_PID=$!
"$BIN" standalone --config "$WORK/auth.toml" --broker-port "$AUTH_BROKER" --web-port "$AUTH_WEB" \
  --data-dir "$WORK/auth" > "$OUT/server-auth.log" 2>&1 &
AUTH_PID=$!
ADMIN=(-H "Authorization: Bearer $(cat "$WORK/admin.token")")
for _ in $(seq 200); do
  curl -fs "http://127.0.0.1:$PLAIN_WEB/admin/v2/brokers/ready" >/dev/null 2>&1 \
    && curl -fs "${ADMIN[@]}" "http://127.0.0.1:$AUTH_WEB/admin/v2/brokers/ready" >/dev/null 2>&1 \
    && break
  sleep 0.1
done
# The perf role may produce and consume in public/default (a namespace grant, not super-user:
# the decision reads the namespace document, as an ordinary application's would).
curl -fs "${ADMIN[@]}" -X POST -H 'Content-Type: application/json' -d '["produce","consume"]' \
  "http://127.0.0.1:$AUTH_WEB/admin/v2/namespaces/public/default/permissions/perf"

# run NAME MODE perf-args...: one perf run against the plain or the secured broker
run() {
  local name=$1 mode=$2; shift 2
  local url=pulsar://127.0.0.1:$PLAIN_BROKER auth=()
  if [ "$mode" = secured ]; then
    url=pulsar://127.0.0.1:$AUTH_BROKER
    auth=(--auth-token-file "$WORK/perf.token")
  fi
  "$BIN" perf produce -u "$url" "${auth[@]}" -d "$SECS" --json "$@" > "$OUT/$name.json" \
    2>"$OUT/$name.log"
}

echo "== plain vs authentication+authorization ($ROUNDS rounds, ${SECS}s each)"
for round in $(seq "$ROUNDS"); do
  for load in async128 sync1k; do
    case $load in
      async128) args=(-s 128 "bench-$load") ;;
      sync1k) args=(-s 1024 --sync "bench-$load") ;;
    esac
    # alternate which goes first, so drift on the machine does not favour one side
    if (( round % 2 )); then order=(plain secured); else order=(secured plain); fi
    for mode in "${order[@]}"; do
      run "$load-$mode-$round" "$mode" "${args[@]}"
    done
  done
done

python3 - "$OUT" "$ROUNDS" <<'PY'
import json, os, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def fields(name):
    with open(os.path.join(out, name + ".json")) as f:
        stream = json.load(f)["streams"][0]
    lat = stream["latency"]
    return stream["msg_per_s"], lat["p50_us"] / 1000.0, lat["p99_us"] / 1000.0
lines = []
for load in ("async128", "sync1k"):
    for mode in ("plain", "secured"):
        runs = [fields("%s-%s-%d" % (load, mode, r)) for r in range(1, rounds + 1)]
        rates = [r[0] for r in runs]
        p50s = [r[1] for r in runs]
        p99s = [r[2] for r in runs]
        lines.append("%-9s %-8s msg/s %s (median %.0f)  p50 ms median %.3f  p99 ms %s (median %.3f)"
                     % (load, mode, [round(x) for x in rates], statistics.median(rates),
                        statistics.median(p50s), [round(x, 3) for x in p99s],
                        statistics.median(p99s)))
text = "\n".join(lines)
print(text)
open(os.path.join(out, "summary.txt"), "w").write(text + "\n")
PY
echo "results: $OUT"
