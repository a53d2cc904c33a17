"""The official Apache Pulsar Java client (org.apache.pulsar:pulsar-client 4.0.x) against the
broker: runs the JUnit 5 suite in tests/java with Maven (`mvn test`) and the fixture's broker URLs.
Covers batching with every codec, the four subscription types (failover events too), individual,
cumulative and batch-index acks, negative acks, ack timeout, DLQ and retry topics, delayed
delivery, readers and seek, partitioned topics and pattern consumers, chunking, JSON / Avro /
Protobuf-native schemas and AUTO_CONSUME, Exclusive and WaitForExclusive producers,
deduplication, TableView, admin topic create / delete, HTTP lookup and unloads under load (see
tests/java).

Maven's artifacts go to tests/java/.m2 (git-ignored), from Maven's default central repository.
MAGNETAR_JAVA_TESTS=... selects tests (surefire's -Dtest syntax, e.g. `AcksTest#batchIndex*`)."""

import os

import pytest

from java_runner import BUILD_AND_RUN_TIMEOUT_S, needs_java, run_java_tests


@needs_java
@pytest.mark.timeout(BUILD_AND_RUN_TIMEOUT_S + 60)  # overrides the suite's per-test --timeout
def test_java_client(server):
    passed = run_java_tests({"MAGNETAR_TEST_SERVICE_URL": server.service_url,
                             "MAGNETAR_TEST_WEB_URL": server.web_url},
                            os.environ.get("MAGNETAR_JAVA_TESTS"))
    print("java client (mvn test): %d passed" % len(passed))
