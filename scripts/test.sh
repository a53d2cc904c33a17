#!/usr/bin/env bash
# Everything Magnetar tests, in the order CI runs it (CI calls exactly this script):
#   1. a Python venv in .venv with the official Pulsar client and pytest (created if missing)
#   (from here on, in the background at the lowest CPU priority: tests/compat/warm_up.py builds
#    the Java and Go suites and resolves the Maven classpaths the compat suite needs)
#   2. cargo fmt --check and cargo clippy -D warnings, then
#      cargo test --workspace --release          (Rust unit and integration tests; the etcd
#      metadata tests start real etcd processes: etcd-server and etcd-client come from Debian when
#      missing, and MAGNETAR_REQUIRE_ETCD=1 makes those tests fail instead of skip without etcd)
#   3. the release binary target/release/magnetar, and the documentation site (mdbook build docs;
#      mdbook is installed into the git-ignored .tools/ when missing)
#   4. pytest tests/compat                         (Pulsar-protocol compatibility suite), then the
#      client tests that keep to public/default again against a secured broker
#      (MAGNETAR_TEST_SECURED=1, tests/compat/secured.py)
#      (its test_prometheus.py runs deploy/'s Grafana dashboard queries and alert rules on a real
#      Prometheus: the Debian package `prometheus` is installed when missing)
#      (its test_console.py drives the web console in headless Chromium with selenium: Debian's
#      chromium and chromium-driver are installed when missing, where root and apt-get are there;
#      elsewhere that test is skipped)
#      (its test_java_client.py runs `mvn test` in tests/java, the official Java client: needs java 17+
#      and mvn; Maven's artifacts go to the git-ignored tests/java/.m2, about 1.5 min warm or cold)
# Exits non-zero as soon as a step fails or runs out of time. Each step is bounded, and so is the
# whole run: TEST_SH_BUDGET_MIN minutes (default 85, CI allows 90).
#
# Extra pytest arguments can be given on the command line: scripts/test.sh -k readers
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

T0=$(date +%s)
BUDGET_S=$(( ${TEST_SH_BUDGET_MIN:-85} * 60 ))
VENV=$ROOT/.venv
PY=$VENV/bin/python

section() {
  printf '\n==================== [%s, +%ds] %s ====================\n' \
    "$(date +%H:%M:%S)" "$(( $(date +%s) - T0 ))" "$*"
}

fail() {
  printf '\n==================== FAILED: %s (after %ds) ====================\n' \
    "$*" "$(( $(date +%s) - T0 ))" >&2
  exit 1
}

# bounded STEP_NAME MAX_SECONDS command...: runs the command with at most MAX_SECONDS, and never
# past the overall budget. A time-out is a failure.
bounded() {
  local name=$1 max=$2; shift 2
  local left=$(( BUDGET_S - ($(date +%s) - T0) ))
  (( left < max )) && max=$left
  (( max > 0 )) || fail "$name: no time left in the ${BUDGET_S}s budget"
  local rc=0
  timeout --kill-after=30 "$max" "$@" || rc=$?
  if (( rc == 124 || rc == 137 )); then fail "$name: timed out after ${max}s"; fi
  return "$rc"
}

# ------------------------------------------------------------------------------------ 1. venv
section "Python venv (.venv): pulsar-client, pytest, selenium"
if [ ! -x "$PY" ] || ! "$PY" -c 'import sys' 2>/dev/null; then
  rm -rf "$VENV"
  python3 -m venv "$VENV" || fail "python3 -m venv"
fi
bounded "pip install" 900 "$PY" -m pip install --quiet --disable-pip-version-check \
  'pulsar-client>=3.5,<4' 'pytest>=8' 'pytest-timeout>=2' 'fastavro>=1.9' 'selenium>=4.11' \
  || fail "pip install"
"$PY" -c 'import pulsar, pytest; print("pulsar-client", pulsar.__version__, "/ pytest", pytest.__version__)' \
  || fail "the venv cannot import pulsar and pytest"

# The openssl CLI makes the TLS tests' certificates (tests/compat/tls_certs.py).
if ! command -v openssl >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  section "Debian packages: openssl"
  bounded "apt-get update" 300 apt-get update -qq || fail "apt-get update"
  DEBIAN_FRONTEND=noninteractive bounded "apt-get install" 300 \
    apt-get install -y -qq openssl >/dev/null || fail "apt-get install openssl"
fi

# Java and Maven for the official Java client's suite (tests/java): from Debian when missing.
if ! command -v mvn >/dev/null 2>&1 || ! command -v java >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    section "Debian packages: maven, default-jdk-headless"
    bounded "apt-get update" 300 apt-get update -qq || fail "apt-get update"
    DEBIAN_FRONTEND=noninteractive bounded "apt-get install" 600 \
      apt-get install -y -qq maven default-jdk-headless >/dev/null || fail "apt-get install maven"
  else
    echo "no mvn/java and no root apt-get: tests/compat/test_java_client.py will be skipped"
  fi
fi

# Headless Chromium and its driver for the web console's browser test
# (tests/compat/test_console.py): from Debian when missing; without them that test is skipped.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    section "Debian packages: chromium, chromium-driver"
    bounded "apt-get update" 300 apt-get update -qq || fail "apt-get update"
    DEBIAN_FRONTEND=noninteractive bounded "apt-get install" 900 \
      apt-get install -y -qq chromium chromium-driver >/dev/null \
      || fail "apt-get install chromium chromium-driver"
  else
    echo "no chromium/chromedriver and no root apt-get: tests/compat/test_console.py will be skipped"
  fi
fi

# etcd for the etcd metadata store's tests (crates/metadata-etcd starts its own etcd processes
# on loopback) and the cluster tests, and etcdctl, which tests/compat/test_replicated.py reads
# ledger metadata with: from Debian when missing. (protoc, which the etcd-client crate's build
# script needs, is the one the protoc-bin-vendored crate ships: .cargo/config.toml.)
if ! command -v etcd >/dev/null 2>&1 || ! command -v etcdctl >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    section "Debian packages: etcd-server, etcd-client"
    bounded "apt-get update" 300 apt-get update -qq || fail "apt-get update"
    DEBIAN_FRONTEND=noninteractive bounded "apt-get install" 600 \
      apt-get install -y -qq etcd-server etcd-client >/dev/null \
      || fail "apt-get install etcd-server etcd-client"
  fi
fi
# Prometheus (server and promtool) for tests/compat/test_prometheus.py, which checks the Grafana
# dashboards and alert rules in deploy/ against a real Prometheus it starts on a loopback port of
# its own: from Debian when missing (without it that test is skipped). The package's own service
# is kept from starting (a policy-rc.d for the install, unless the machine has one) and stopped
# if it started anyway: nothing here needs it, nor its port 9090.
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    section "Debian package: prometheus"
    bounded "apt-get update" 300 apt-get update -qq || fail "apt-get update"
    own_policy=
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && own_policy=1
    fi
    rc=0
    DEBIAN_FRONTEND=noninteractive bounded "apt-get install" 600 \
      apt-get install -y -qq --no-install-recommends prometheus >/dev/null || rc=$?
    [ -n "$own_policy" ] && rm -f /usr/sbin/policy-rc.d
    (( rc == 0 )) || fail "apt-get install prometheus"
    timeout 60 service prometheus stop >/dev/null 2>&1 || true
  else
    echo "no prometheus/promtool and no root apt-get: tests/compat/test_prometheus.py will be skipped"
  fi
fi

command -v etcd >/dev/null 2>&1 || fail "no etcd (apt-get install etcd-server): the etcd metadata tests need it"
export MAGNETAR_REQUIRE_ETCD=1

# One build profile for every step below (clippy, cargo test, the binary, and the README's
# `cargo run --release`, which the suite runs): the release profile without LTO, with more
# codegen units and line tables only. Thin LTO in ~40 separately linked test binaries cost
# most of the suite's time; benchmarks build with the real release profile (Cargo.toml).
export CARGO_PROFILE_RELEASE_LTO=false
export CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16
export CARGO_PROFILE_RELEASE_DEBUG=line-tables-only

# ------------------------------------------------------------------------ background warm-up
# What the compat suite would build on its own clock (Maven classpaths, the Java suite's classes,
# the Go suite's packages) is built now, at the lowest CPU priority, while cargo compiles and the
# Rust tests mostly wait: tests/compat/warm_up.py. Its output: target/warm-up.log. It runs in a
# session of its own so that, should this script stop early, the trap ends it and its children;
# a new session is a new scheduler autogroup, whose weight is set low too (else the kernel shares
# the CPU evenly between the two sessions, whatever the nice value inside: clippy took 206 s
# instead of 116 s beside it), and its disk I/O goes in the idle class.
mkdir -p target
setsid bash -c 'echo 19 > /proc/self/autogroup 2>/dev/null
  command -v ionice >/dev/null && exec ionice -c 3 nice -n 19 "$@"; exec nice -n 19 "$@"' \
  warm-up "$PY" tests/compat/warm_up.py > target/warm-up.log 2>&1 &
WARM_UP_PID=$!
trap 'kill -- -"$WARM_UP_PID" 2>/dev/null || true' EXIT

# ------------------------------------------------------------------------------------ style
section "cargo fmt --check, cargo clippy -D warnings"
bounded "cargo fmt" 120 cargo fmt --all -- --check || fail "cargo fmt --all -- --check (run cargo fmt --all)"
bounded "cargo clippy" 1200 cargo clippy --release --workspace --all-targets -- -D warnings \
  || fail "cargo clippy --release --workspace --all-targets -- -D warnings"

# ------------------------------------------------------------------------------------ 2. cargo test
section "cargo test --workspace --release"
bounded "cargo test" 3000 cargo test --workspace --release || fail "cargo test --workspace --release"

# ------------------------------------------------------------------------------------ 3. binary
# Same binary as `cargo build --release -p magnetar`, but with the package set of the test build
# above, so cargo resolves the same features and reuses its artifacts instead of compiling again.
section "cargo build --release (magnetar binary)"
bounded "cargo build" 1200 cargo build --release --workspace --bin magnetar \
  || fail "cargo build --release -p magnetar"
[ -x target/release/magnetar ] || fail "target/release/magnetar was not built"

# ------------------------------------------------------------------------------------ docs
# The documentation site (docs/, mdBook): mdbook is installed into the git-ignored .tools/ when
# missing; its internal links and runnable blocks are checked by tests/compat/test_docs.py.
section "mdbook build docs (the documentation site)"
MDBOOK=$ROOT/.tools/bin/mdbook
if [ ! -x "$MDBOOK" ]; then
  bounded "cargo install mdbook" 1200 cargo install mdbook --locked --quiet --root "$ROOT/.tools" \
    || fail "cargo install mdbook --root .tools"
fi
bounded "mdbook build" 300 "$MDBOOK" build docs || fail "mdbook build docs"

# ------------------------------------------------------------------------------------ 4. pytest
section "waiting for the background warm-up (target/warm-up.log)"
if ! timeout 600 tail --pid="$WARM_UP_PID" -f /dev/null; then
  echo "the warm-up did not end within 600 s: ended; what it did not build, the tests build"
  kill -- -"$WARM_UP_PID" 2>/dev/null || true
fi
cat target/warm-up.log
section "pytest tests/compat (Pulsar compatibility, official Python client)"
rc=0
bounded "pytest" 1800 "$PY" -m pytest tests/compat -p no:cacheprovider --timeout=300 -ra --durations=25 "$@" || rc=$?
case $rc in
  0) ;;
  5) fail "pytest collected no tests (exit code 5)" ;;
  *) fail "pytest tests/compat (exit code $rc)" ;;
esac

# The client tests that keep to public/default, again against a broker secured as Pulsar's own
# client test service is (tests/compat/secured.py: TLS beside the plain ports, token, basic and
# TLS authentication, authorization, the anonymous role granted public/default).
SECURED_TESTS="test_secured_mode.py test_produce_consume.py test_readers.py test_seek.py
  test_acks.py test_subscriptions.py test_compaction.py test_read_compacted.py"
section "pytest against a secured broker (MAGNETAR_TEST_SECURED=1)"
rc=0
# shellcheck disable=SC2086
MAGNETAR_TEST_SECURED=1 bounded "pytest (secured)" 900 "$PY" -m pytest \
  $(printf 'tests/compat/%s ' $SECURED_TESTS) -p no:cacheprovider --timeout=300 -q "$@" || rc=$?
case $rc in
  0|5) ;;  # 5: the extra arguments selected none of these
  *) fail "pytest against a secured broker (exit code $rc)" ;;
esac

section "all tests passed in $(( $(date +%s) - T0 ))s"
