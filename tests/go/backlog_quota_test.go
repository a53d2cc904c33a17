//go:build quota

package compat

// Tests that need a broker with a small backlog quota checked every second.
// tests/compat/test_limits.py starts such a broker (producer_request_hold, 100 KB) and runs
// them, and counts the quota's disconnects in its log; the build tag keeps them out of the
// plain `go test ./...` run against the standalone.

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

// A backlog quota with producer_request_hold while the Go client keeps 1,000 sends in flight
// and the consumer rests, so the backlog goes over the quota again and again: each time the
// broker closes the producer, answers the sends it took before CLOSE_PRODUCER and drops the
// ones the client writes after it (the client resends those on its re-created producer). Every
// send ends acknowledged, and every message is stored exactly once: the Go client writes sends
// while it re-creates its producer, so it is the client that meets the dropped-unanswered path.
// How many times the quota should have closed the producer before sending stops (the Python
// harness checks the broker's log for as many).
const quotaDisconnectsWanted = 3

func TestBacklogQuotaHoldUnderLoadStoresEveryMessageOnce(t *testing.T) {
	const sendingFor = 8 * time.Second
	c := newClient(t)
	topic := uniqueTopic("quota-hold-load")
	cons := subscribe(t, c, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "slow",
		ReceiverQueueSize: 1000})
	p := newProducer(t, c, pulsar.ProducerOptions{
		Topic:              topic,
		DisableBatching:    true,
		MaxPendingMessages: 1000,
		SendTimeout:        -1, // no time-out: a held producer's sends wait
	})

	var sent atomic.Int64
	var sending atomic.Bool
	sending.Store(true)
	var readMu sync.Mutex
	idsByPayload := map[int]map[string]bool{}
	distinct := func() int {
		readMu.Lock()
		defer readMu.Unlock()
		return len(idsByPayload)
	}
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		for sending.Load() || int64(distinct()) < sent.Load() {
			// Pauses are pacing, not synchronisation: the backlog grows over the quota while
			// the consumer rests, and shrinks under it when it reads again.
			resumeAt := time.Now().Add(600 * time.Millisecond)
			for time.Now().Before(resumeAt) {
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				m, err := cons.Receive(ctx)
				cancel()
				if err != nil {
					continue
				}
				i, err := strconv.Atoi(string(m.Payload()))
				if err != nil {
					t.Errorf("a message that was never sent: %q", m.Payload())
					return
				}
				readMu.Lock()
				if idsByPayload[i] == nil {
					idsByPayload[i] = map[string]bool{}
				}
				idsByPayload[i][m.ID().String()] = true
				readMu.Unlock()
				cons.Ack(m)
			}
			if sending.Load() {
				time.Sleep(1500 * time.Millisecond)
			}
		}
	}()

	var sends sendTally
	// At least sendingFor, and on a slow machine longer: until the broker's log (when the
	// harness names it) shows the quota disconnecting the producer three times, at most 40 s.
	minimumUntil, atMostUntil := time.Now().Add(sendingFor), time.Now().Add(40*time.Second)
	disconnectsSeen := func() int {
		path := os.Getenv("MAGNETAR_TEST_SERVER_LOG")
		if path == "" {
			return quotaDisconnectsWanted
		}
		log, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("server log: %v", err)
		}
		return strings.Count(string(log), "backlog quota exceeded: disconnecting producers")
	}
	n := 0
	lastLook := time.Now()
	for ; time.Now().Before(atMostUntil); n++ {
		if now := time.Now(); !now.Before(minimumUntil) && now.Sub(lastLook) > 200*time.Millisecond {
			lastLook = now
			if disconnectsSeen() >= quotaDisconnectsWanted {
				break
			}
		}
		sends.send(p, n)
		sent.Store(int64(n + 1))
	}
	if err := p.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	sending.Store(false)
	select {
	case <-readerDone:
	case <-time.After(60 * time.Second):
		t.Fatalf("not every message read within 60 s: %d of %d", distinct(), n)
	}
	sends.requireAllAcknowledged(t, n)
	readMu.Lock()
	defer readMu.Unlock()
	var twice []int
	for i := 0; i < n; i++ {
		ids := idsByPayload[i]
		if len(ids) == 0 {
			t.Fatalf("message %d was acknowledged and is not stored (%d of %d read)", i, len(idsByPayload), n)
		}
		if len(ids) > 1 {
			twice = append(twice, i)
		}
	}
	if len(idsByPayload) != n {
		t.Fatalf("%d distinct payloads read, %d sent", len(idsByPayload), n)
	}
	if len(twice) > 0 {
		shown := twice
		if len(shown) > 10 {
			shown = shown[:10]
		}
		t.Fatalf("%d of %d messages stored twice: %v", len(twice), n, shown)
	}
	t.Logf("%d sends under a held quota, each stored once", n)
}
