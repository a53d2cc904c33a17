#!/usr/bin/env bash
# TLS cost benchmark (not a test; figures go to docs/benchmarks.md), issue 17: one standalone
# with [tls] (plain and TLS ports both open), and `magnetar perf produce` over pulsar:// and
# pulsar+ssl:// alternated ROUNDS times in one run (this machine is noisy):
#   async 128 B (batching on, as fast as possible): msg/s;
#   sync 1 KiB (one message in flight): p50 and p99.
# Certificates (EC P-256, a throw-away CA) are made with openssl in a temporary directory.
# Usage: bench/tls.sh [--secs 20] [--rounds 3]
# Needs target/release/magnetar, openssl and curl. Writes bench/results/tls-<date>/.
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
OUT=$ROOT/bench/results/tls-$(date +%Y%m%d-%H%M%S)
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/magnetar-tls-XXXXXX)
BROKER_PORT=${BROKER_PORT:-26650} WEB_PORT=${WEB_PORT:-28080}
BROKER_PORT_TLS=${BROKER_PORT_TLS:-26651} WEB_PORT_TLS=${WEB_PORT_TLS:-28443}
SERVER_PID=
cleanup() {
  [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# A CA and a server certificate for 127.0.0.1 / localhost.
(
  cd "$WORK"
  printf '[req]\ndistinguished_name=dn\nprompt=no\n[dn]\nCN=bench-ca\n[v3_ca]\nbasicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n' > ca.cnf
  openssl req -x509 -config ca.cnf -extensions v3_ca -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
    -nodes -keyout ca.key -out ca.pem -days 2 2>/dev/null
  printf 'basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n' > server.ext
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout server.key \
    -out server.csr -subj /CN=localhost 2>/dev/null
  openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -set_serial 1 -days 2 \
    -extfile server.ext -out server.pem 2>/dev/null
)
cat > "$WORK/magnetar.toml" <<TOML
[tls]
enabled = true
cert_file = "$WORK/server.pem"
key_file = "$WORK/server.key"
broker_port_tls = $BROKER_PORT_TLS
web_port_tls = $WEB_PORT_TLS
TOML

"$BIN" standalone --config "$WORK/magnetar.toml" --broker-port "$BROKER_PORT" \
  --web-port "$WEB_PORT" --data-dir "$WORK/data" > "$OUT/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 100); do
  curl -fs "http://127.0.0.1:$WEB_PORT/admin/v2/brokers/ready" >/dev/null 2>&1 && break
  sleep 0.1
done

# run NAME TRANSPORT perf-args...: one perf run, its JSON summary in $OUT/NAME.json
run() {
  local name=$1 transport=$2; shift 2
  local url=(-u "pulsar://127.0.0.1:$BROKER_PORT")
  if [ "$transport" = tls ]; then
    url=(-u "pulsar+ssl://127.0.0.1:$BROKER_PORT_TLS" --tls-trust-certs-file "$WORK/ca.pem")
  fi
  "$BIN" perf produce "${url[@]}" -d "$SECS" --json "$@" "bench-tls-$name" \
    > "$OUT/$name.json" 2>"$OUT/$name.log"
}

echo "== plain against TLS ($ROUNDS rounds, ${SECS}s each)"
for round in $(seq "$ROUNDS"); do
  for mode in async128 sync1k; do
    case $mode in
      async128) args=(-s 128) ;;
      sync1k) args=(-s 1024 --sync) ;;
    esac
    # Alternate which goes first, so a drift of the machine does not favour one.
    if (( round % 2 )); then order=(plain tls); else order=(tls plain); fi
    for transport in "${order[@]}"; do
      run "$mode-$transport-$round" "$transport" "${args[@]}"
    done
  done
done

python3 - "$OUT" "$ROUNDS" <<'PY'
import json, sys, os, statistics
out, rounds = sys.argv[1], int(sys.argv[2])
def load(name):
    with open(os.path.join(out, name + ".json")) as f:
        return json.load(f)["streams"][0]
lines = []
for mode in ("async128", "sync1k"):
    for transport in ("plain", "tls"):
        rates, p50s, p99s = [], [], []
        for r in range(1, rounds + 1):
            s = load("%s-%s-%d" % (mode, transport, r))
            rates.append(s["msg_per_s"])
            p50s.append(s["latency"]["p50_us"] / 1000.0)
            p99s.append(s["latency"]["p99_us"] / 1000.0)
        lines.append("%-9s %-6s msg/s %s (median %.0f)  p50 ms median %.3f  p99 ms %s (median %.3f)"
                     % (mode, transport, [round(x) for x in rates], statistics.median(rates),
                        statistics.median(p50s), [round(x, 3) for x in p99s],
                        statistics.median(p99s)))
text = "\n".join(lines)
print(text)
open(os.path.join(out, "summary.txt"), "w").write(text + "\n")
PY
echo "results: $OUT"
