"""Official Go client tests that need a broker restart in the middle. A Go test cannot restart
the broker, so each scenario is two Go tests (tests/go/restart_phases_test.go, build tag
`restartphases`, left out of the plain `go test ./...` of test_go_client.py): this file runs
phase 1, restarts the broker the fixture manages, then runs phase 2 with the same topic prefix
(MAGNETAR_TEST_PHASE_PREFIX).

Batch-index acknowledgement across a restart: a batch of 10 with 5 of its messages acknowledged
(Go's EnableBatchIndexAcknowledgment: ACK with an ack_set and no batch_size; individually on one
topic, cumulatively up to the 5th on another); after a graceful restart a re-subscribing consumer
gets exactly the 5 unacknowledged messages. Pulsar 4.0 keeps batch-index acks with
acknowledgmentAtBatchIndexLevelEnabled=true (the default from Pulsar 4.1), but Pulsar 4.0.7 so
configured was seen to lose them over a graceful standalone restart made right after the acks (all
10 came back): Magnetar promises more here (an ack receipt means the ack is durable)."""

import uuid

import pytest

from go_runner import BUILD_AND_RUN_TIMEOUT_S, needs_go, run_go_test


def run_go_phase(server, test_name, prefix):
    run_go_test("restartphases", test_name, {
        "MAGNETAR_TEST_SERVICE_URL": server.service_url,
        "MAGNETAR_TEST_WEB_URL": server.web_url,
        "MAGNETAR_TEST_PHASE_PREFIX": prefix,
    })


@pytest.mark.restarts_server
@needs_go
@pytest.mark.timeout(2 * BUILD_AND_RUN_TIMEOUT_S + 120)
def test_go_batch_index_acks_survive_restart(server):
    prefix = "persistent://public/default/go-bidx-restart-%s" % uuid.uuid4().hex[:16]
    run_go_phase(server, "TestBatchIndexAckPhase1", prefix)
    assert server.stop(timeout=60), "the broker did not exit within 60 s of SIGTERM"
    server.start()
    run_go_phase(server, "TestBatchIndexAckPhase2", prefix)
