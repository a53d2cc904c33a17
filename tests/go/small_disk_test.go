//go:build smalldisk

package compat

// A test that needs a broker whose disk really fills up: tests/compat/test_limits.py starts one
// on a 48 MiB file system of its own (min_free_mb = 0, an 8 MiB reserve), runs this, then
// deletes the topic and checks that the disk comes back. The build tag keeps it out of the plain
// `go test ./...` run against the standalone.

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

// The Go client sends 64 KiB messages until the disk is full: the broker closes its producer and
// refuses to create it again while short of disk, so a send fails, promptly, with
// ErrProducerBlockedQuotaExceeded ("disk full: ..."), instead of being resent on a new
// connection over and over. Every message acknowledged before is then consumed, in order.
func TestADiskThatFillsUpFailsSendsAndKeepsWhatWasAcknowledged(t *testing.T) {
	topic := os.Getenv("MAGNETAR_SMALL_DISK_TOPIC")
	if topic == "" {
		t.Fatalf("MAGNETAR_SMALL_DISK_TOPIC must be set (run through tests/compat/test_limits.py)")
	}
	c := newClient(t)
	cons := subscribe(t, c, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "keep"})
	p := newProducer(t, c, pulsar.ProducerOptions{
		Topic:           topic,
		DisableBatching: true,
		SendTimeout:     10 * time.Second,
	})
	payload := make([]byte, 64*1024)
	var acknowledged []uint64
	var refused error
	started := time.Now()
	for i := uint64(0); i < 2000; i++ { // 125 MiB: far more than the disk holds
		binary.BigEndian.PutUint64(payload, i)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := p.Send(ctx, &pulsar.ProducerMessage{Payload: payload})
		cancel()
		if err != nil {
			refused = err
			break
		}
		acknowledged = append(acknowledged, i)
	}
	if refused == nil {
		t.Fatalf("the disk never filled up: %d sends acknowledged", len(acknowledged))
	}
	if !errors.Is(refused, pulsar.ErrProducerBlockedQuotaExceeded) {
		t.Fatalf("after %d sends: %v, want ErrProducerBlockedQuotaExceeded", len(acknowledged), refused)
	}
	if took := time.Since(started); took > 60*time.Second {
		t.Fatalf("filling the disk and the refusal took %v", took)
	}
	if len(acknowledged) < 300 {
		t.Fatalf("only %d sends acknowledged before the refusal", len(acknowledged))
	}
	received := receiveN(t, cons, len(acknowledged))
	for i, m := range received {
		if got := binary.BigEndian.Uint64(m.Payload()); got != acknowledged[i] {
			t.Fatalf("message %d is %d, want %d (every acknowledged message, in order)", i, got, acknowledged[i])
		}
	}
	if err := cons.AckCumulative(received[len(received)-1]); err != nil {
		t.Fatalf("acknowledge: %v", err)
	}
	t.Logf("%d sends acknowledged, then refused: %v; all consumed in order", len(acknowledged), refused)
}
