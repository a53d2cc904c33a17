#!/usr/bin/env bash
# Runs real Apache Pulsar standalone in the foreground as a stand-in for `magnetar standalone`,
# so that tests/compat can be checked against Pulsar, restart and kill -9 tests included:
#
#   MAGNETAR_TEST_SERVER_CMD="scripts/pulsar-test-server.sh {broker_port} {web_port} {data_dir}" \
#   MAGNETAR_TEST_START_TIMEOUT=120 MAGNETAR_TEST_READY_PATH=/admin/v2/namespaces/public/default \
#   .venv/bin/pytest tests/compat
#
# (scripts/compat-vs-pulsar.sh does exactly that.) Usage: pulsar-test-server.sh BROKER_PORT WEB_PORT DATA_DIR
# The process execs into the JVM, so SIGTERM / SIGKILL reach the broker itself. All state lives
# under DATA_DIR; starting again on the same DATA_DIR recovers it. Needs the Pulsar jars fetched by
# the anchor (shared/anchors/pulsar: `run.sh fetch`); PULSAR_ANCHOR_DIR points at that folder.
set -euo pipefail

[ $# -eq 3 ] || { echo "usage: $0 BROKER_PORT WEB_PORT DATA_DIR" >&2; exit 2; }
broker_port=$1 web_port=$2 data_dir=$3
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
anchor=${PULSAR_ANCHOR_DIR:-$repo/../shared/anchors/pulsar}
lib=$anchor/work/lib-broker
if [ ! -f "$lib/.complete" ]; then
  echo "Pulsar jars not found in $lib: run 'bash $anchor/run.sh fetch' (or set PULSAR_ANCHOR_DIR)" >&2
  exit 3
fi

mkdir -p "$data_dir/pulsar-conf" "$data_dir/pulsar-logs"
# (The embedded bookie picks its port itself and keeps it in its data dir across restarts.)

sed -e "s|^brokerServicePort=.*|brokerServicePort=$broker_port|" \
    -e "s|^webServicePort=.*|webServicePort=$web_port|" \
    -e "s|^webServiceUrl=.*|webServiceUrl=http://127.0.0.1:$web_port/|" \
    -e "s|^brokerServiceUrl=.*|brokerServiceUrl=pulsar://127.0.0.1:$broker_port/|" \
    "$anchor/conf/standalone.conf" > "$data_dir/pulsar-conf/standalone.conf"
cp "$anchor/conf/log4j2.xml" "$data_dir/pulsar-conf/"

# JVM flags as the anchor's run.sh (bin/pulsar standalone defaults), logs to stdout.
exec java -cp "$data_dir/pulsar-conf:$lib/*" \
  -Dlog4j.shutdownHookEnabled=false -Dlog4j.configurationFile=log4j2.xml \
  -Djute.maxbuffer=10485760 -Djava.net.preferIPv4Stack=true -Dio.netty.tryReflectionSetAccessible=true \
  --add-opens java.base/java.io=ALL-UNNAMED --add-opens java.base/java.util.zip=ALL-UNNAMED \
  --add-opens java.base/java.nio=ALL-UNNAMED --add-opens java.base/jdk.internal.misc=ALL-UNNAMED \
  --add-opens java.base/sun.net=ALL-UNNAMED --add-opens java.management/sun.management=ALL-UNNAMED \
  -Xms2g -Xmx2g -XX:MaxDirectMemorySize=4g -XX:+UseZGC -XX:+PerfDisableSharedMem \
  -Dpulsar.allocator.exit_on_oom=true -Dio.netty.recycler.maxCapacityPerThread=4096 \
  -Dpulsar.log.appender=Console "-Dpulsar.log.dir=$data_dir/pulsar-logs" -Dpulsar.log.level=info \
  -Dlog4j2.is.webapp=false \
  '-Dzookeeper.4lw.commands.whitelist=*' -Dzookeeper.snapshot.trust.empty=true \
  -Dbookkeeper.metadata.bookie.drivers=org.apache.pulsar.metadata.bookkeeper.PulsarMetadataBookieDriver \
  -Dbookkeeper.metadata.client.drivers=org.apache.pulsar.metadata.bookkeeper.PulsarMetadataClientDriver \
  org.apache.pulsar.PulsarStandaloneStarter --config "$data_dir/pulsar-conf/standalone.conf" \
  --metadata-dir "$data_dir/metadata" --bookkeeper-dir "$data_dir/bookkeeper" -nfw -nss
