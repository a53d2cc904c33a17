#!/usr/bin/env bash
# The nemesis suite's long run (issue 48; tests/compat/test_nemesis.py, which the suite runs for 2
# minutes): the cluster under load and random faults for --minutes, then the queue checker.
#   scripts/nemesis.sh [--minutes 30] [--seed S] [--keep-logs DIR]
# The seed (drawn when not given) and the fault schedule are printed first; the same seed
# replays the same schedule.
# Needs what scripts/test.sh installs (.venv, etcd) and the release binary
# (cargo build --release -p magnetar).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MINUTES=30 SEED="" KEEP=""
while (( $# )); do
  case $1 in
    --minutes) MINUTES=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --keep-logs) KEEP=$2; shift 2 ;;
    *) echo "usage: $0 [--minutes M] [--seed S] [--keep-logs DIR]" >&2; exit 2 ;;
  esac
done
[ -n "$SEED" ] || SEED=$(python3 -c 'import random; print(random.randrange(1 << 32))')
TIMEOUT_S=$(python3 -c "print(int(float('$MINUTES') * 60 + 900))")
cd "$ROOT"
MAGNETAR_REQUIRE_ETCD=1 MAGNETAR_NEMESIS_MINUTES=$MINUTES MAGNETAR_NEMESIS_SEED=$SEED \
  MAGNETAR_TEST_KEEP_LOGS=$KEEP exec "$ROOT/.venv/bin/python" -m pytest \
  tests/compat/test_nemesis.py -k test_nemesis_loses_nothing -s -q -p no:cacheprovider \
  --timeout="$TIMEOUT_S"
