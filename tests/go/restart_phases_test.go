//go:build restartphases

package compat

// Tests in two phases with a broker restart in between. A Go test cannot restart the
// broker, so tests/compat/test_go_restart_phases.py runs phase 1, restarts the broker it
// manages, then runs phase 2 with the same MAGNETAR_TEST_PHASE_PREFIX. The build tag keeps
// these tests out of the plain `go test ./...` run (test_go_client.py), where they could
// only fail or skip.

import (
	"os"
	"testing"
)

func phasePrefix(t *testing.T) string {
	t.Helper()
	prefix := os.Getenv("MAGNETAR_TEST_PHASE_PREFIX")
	if prefix == "" {
		t.Fatalf("MAGNETAR_TEST_PHASE_PREFIX is not set (run through tests/compat/test_go_restart_phases.py)")
	}
	return prefix
}

// Phase 1: a batch of 10 on each topic, part of it acknowledged with batch-index acks.
func TestBatchIndexAckPhase1(t *testing.T) {
	prefix := phasePrefix(t)
	c := newClient(t)
	for _, sc := range batchAckScenarios {
		t.Run(sc.name, func(t *testing.T) {
			batchAckPhase1(t, c, prefix+"-"+sc.name, sc)
		})
	}
}

// Phase 2 (after the restart): exactly the unacknowledged messages come back.
func TestBatchIndexAckPhase2(t *testing.T) {
	prefix := phasePrefix(t)
	c := newClient(t)
	for _, sc := range batchAckScenarios {
		t.Run(sc.name, func(t *testing.T) {
			batchAckPhase2(t, c, prefix+"-"+sc.name, sc)
		})
	}
}
