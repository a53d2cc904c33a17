#!/usr/bin/env bash
# Magnetar vs Apache Pulsar standalone, side by side on this machine, in one run (a benchmark,
# not a test: CI does not run it). Both brokers fsync before acknowledging; both are driven by
# `magnetar perf`. Prints one table with both systems and the ratios, and the raw fdatasync p50
# of the disk measured in the same run; writes it to bench/results/compare-<time>.{md,json}.
# The systems alternate by rounds (Magnetar, Pulsar, Pulsar, Magnetar); each figure is the
# median of a system's rounds, and a ratio whose halves saw very different host stalls is flagged.
#
#   bench/compare.sh                      the whole table (about 20 minutes here, plus Pulsar's starts)
#   bench/compare.sh --rounds 1           one round each (half the time, no protection from weather)
#   bench/compare.sh --systems magnetar   Magnetar only (no Pulsar needed)
#   bench/compare.sh --backlog 1000000 --secs 10    a shorter run
#   bench/compare.sh --help               every option
#
# Needs ports 6650 and 8080 free. Apache Pulsar comes from the anchor in shared/anchors/pulsar
# (Maven Central jars, `run.sh start fsync`); if its jars are not fetched there, the anchor is
# copied to $TMPDIR and fetched (about 3 minutes, 320 MB). PULSAR_ANCHOR_DIR names an anchor copy
# whose jars are fetched already. MAGNETAR_BIN overrides the binary (default: a release build).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

# Measure only what we start: refuse when something already answers on the ports we use.
if [[ " $* " != *" --help "* && " $* " != *" -h "* ]]; then
  for port in 6650 8080; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "bench/compare.sh: port $port is already taken on 127.0.0.1; stop what listens there first" >&2
      exit 2
    fi
  done
fi

if [ -z "${MAGNETAR_BIN:-}" ]; then
  cargo build --release -p magnetar
  MAGNETAR_BIN=$ROOT/target/release/magnetar
fi

anchor_args=()
if [[ " $* " != *" --systems magnetar "* ]]; then
  anchor=$("$ROOT/scripts/pulsar-anchor.sh")
  anchor_args=(--anchor "$anchor")
fi

exec python3 "$ROOT/bench/compare.py" --binary "$MAGNETAR_BIN" "${anchor_args[@]}" "$@"
