#!/usr/bin/env bash
# Runs the compatibility suite (tests/compat) against real Apache Pulsar, to prove the tests encode
# Pulsar's behaviour. Magnetar must then pass the very same tests (scripts/test.sh).
#
#   scripts/compat-vs-pulsar.sh [managed|external|both] [pytest args...]
#
#   managed  (default) pytest starts Pulsar itself through scripts/pulsar-test-server.sh on free
#            ports with a temporary data dir, and kills / restarts it: every test runs, the
#            durability ones included.
#   external Pulsar started once by the anchor (127.0.0.1:6650 / :8080) and used through
#            MAGNETAR_TEST_SERVICE_URL / MAGNETAR_TEST_WEB_URL: the restart tests are skipped.
#
# Pulsar comes from the anchor in shared/anchors/pulsar (Maven Central jars). If its jars are not
# fetched there, the anchor is copied to $TMPDIR and fetched there (about 3 minutes, 320 MB).
# PULSAR_ANCHOR_DIR names an anchor copy whose jars are already fetched. Pulsar needs a 2 GiB heap.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
mode=${1:-managed}
[ $# -gt 0 ] && shift
PY=$ROOT/.venv/bin/python
[ -x "$PY" ] || { echo "no .venv: run scripts/test.sh once, or python3 -m venv .venv && .venv/bin/pip install pulsar-client pytest" >&2; exit 2; }

anchor=$("$ROOT/scripts/pulsar-anchor.sh")
export PULSAR_ANCHOR_DIR=$anchor
echo "Pulsar anchor: $anchor"

run_managed() {
  echo "== tests/compat against Apache Pulsar managed by pytest (restart tests included)"
  export MAGNETAR_TEST_SERVER_CMD="scripts/pulsar-test-server.sh {broker_port} {web_port} {data_dir}"
  export MAGNETAR_TEST_START_TIMEOUT=${MAGNETAR_TEST_START_TIMEOUT:-150}
  export MAGNETAR_TEST_READY_PATH=/admin/v2/namespaces/public/default
  local rc=0 t
  timeout --kill-after=30 3600 "$PY" -m pytest tests/compat -m "not restarts_server" --timeout=600 "$@" || rc=$?
  # Each restart test in a session (and a Pulsar) of its own: after a kill -9, Pulsar standalone's
  # embedded bookie loses its registration when the killed process's metadata session expires
  # (about a minute later: "Not enough non-faulty bookies"), which would break the next tests.
  for t in $("$PY" -m pytest tests/compat -m restarts_server --collect-only -q | grep '::'); do
    timeout --kill-after=30 1200 "$PY" -m pytest "tests/compat/$t" --timeout=600 "$@" || rc=$?
  done
  return "$rc"
}

run_external() {
  echo "== tests/compat against an external Apache Pulsar (127.0.0.1:6650, restart tests skipped)"
  bash "$anchor/run.sh" start
  local rc=0
  MAGNETAR_TEST_SERVICE_URL=pulsar://127.0.0.1:6650 MAGNETAR_TEST_WEB_URL=http://127.0.0.1:8080 \
    timeout --kill-after=30 3600 "$PY" -m pytest tests/compat --timeout=600 "$@" || rc=$?
  bash "$anchor/run.sh" stop || true
  return "$rc"
}

case $mode in
  managed) run_managed "$@" ;;
  external) run_external "$@" ;;
  both) run_external "$@"; run_managed "$@" ;;
  *) echo "usage: $0 [managed|external|both] [pytest args...]" >&2; exit 2 ;;
esac
