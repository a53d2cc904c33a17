#!/usr/bin/env bash
# Prints the directory of a Pulsar anchor (shared/anchors/pulsar) whose jars are fetched, for
# scripts that run real Apache Pulsar (compat-vs-pulsar.sh, bench/compare.sh).
#   PULSAR_ANCHOR_DIR set: that directory, as is.
#   shared/anchors/pulsar fetched: that one.
#   otherwise: a copy in $TMPDIR, fetched there (about 3 minutes, 320 MB, from Maven Central).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
anchor=${PULSAR_ANCHOR_DIR:-}
if [ -z "$anchor" ]; then
  src=$ROOT/../shared/anchors/pulsar
  if [ -f "$src/work/lib-broker/.complete" ]; then
    anchor=$src
  else
    anchor=${TMPDIR:-/tmp}/magnetar-pulsar-anchor
    if [ ! -f "$anchor/run.sh" ]; then
      [ -f "$src/run.sh" ] || { echo "no Pulsar anchor at $src" >&2; exit 2; }
      cp -r "$src" "$anchor" && chmod -R u+w "$anchor"
    fi
    [ -f "$anchor/work/lib-broker/.complete" ] || bash "$anchor/run.sh" fetch >&2
  fi
fi
echo "$anchor"
