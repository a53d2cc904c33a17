package compat

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

// Batch-index acknowledgement (ConsumerOptions.EnableBatchIndexAcknowledgment): the
// client acknowledges single messages of a batch by sending the batch's entry id with
// an ack_set (a bit set of the indexes still unacknowledged; the Go client sends no
// batch_size). Pulsar keeps those per-index acks on the subscription's cursor: when the
// batch is dispatched again (reconnect, restart) the MESSAGE carries the ack_set and the
// client hands out only the unacknowledged messages. Acknowledging the remaining
// indexes acknowledges the whole entry. (Pulsar does this with
// acknowledgmentAtBatchIndexLevelEnabled=true, its default from 4.1; Pulsar 4.0.7 so
// configured passes these tests.)
//
// The restart variant (acks, broker restart, re-subscribe) is in
// restart_phases_test.go (build tag restartphases), driven by
// tests/compat/test_go_restart_phases.py.

const batchSize = 10

// batchAckScenario acknowledges part of a batch of batchSize messages and says which
// batch indexes must come back.
type batchAckScenario struct {
	name      string
	subType   pulsar.SubscriptionType
	ack       func(t *testing.T, cons pulsar.Consumer, msgs []pulsar.Message)
	remaining []int
}

var batchAckScenarios = []batchAckScenario{
	{
		// every other message acknowledged one by one
		name:    "individual",
		subType: pulsar.Shared,
		ack: func(t *testing.T, cons pulsar.Consumer, msgs []pulsar.Message) {
			for _, i := range []int{0, 2, 4, 6, 8} {
				ack(t, cons, msgs[i])
			}
		},
		remaining: []int{1, 3, 5, 7, 9},
	},
	{
		// a cumulative ack up to the 5th message (index 4)
		name:    "cumulative",
		subType: pulsar.Exclusive,
		ack: func(t *testing.T, cons pulsar.Consumer, msgs []pulsar.Message) {
			if err := cons.AckCumulative(msgs[4]); err != nil {
				t.Fatalf("cumulative ack of %v: %v", msgs[4].ID(), err)
			}
		},
		remaining: []int{5, 6, 7, 8, 9},
	},
}

// publishOneBatch publishes batchSize messages "<topic>#i" that the producer puts into
// a single batch (one entry), and checks that they did land in one entry.
func publishOneBatch(t *testing.T, c pulsar.Client, topic string) {
	t.Helper()
	p, err := c.CreateProducer(pulsar.ProducerOptions{
		Topic:                   topic,
		BatchingMaxMessages:     batchSize,
		BatchingMaxPublishDelay: time.Minute, // the batch is closed by its size or the flush
		BatchingMaxSize:         1 << 20,
	})
	if err != nil {
		t.Fatalf("batching producer on %s: %v", topic, err)
	}
	defer p.Close()
	type receipt struct {
		i   int
		id  pulsar.MessageID
		err error
	}
	receipts := make(chan receipt, batchSize)
	for i := 0; i < batchSize; i++ {
		p.SendAsync(context.Background(), &pulsar.ProducerMessage{Payload: []byte(batchPayload(topic, i))},
			func(id pulsar.MessageID, _ *pulsar.ProducerMessage, err error) {
				receipts <- receipt{i, id, err}
			})
	}
	if err := p.FlushWithCtx(ctxTimeout(t, 30*time.Second)); err != nil {
		t.Fatalf("flush: %v", err)
	}
	ids := make([]pulsar.MessageID, batchSize)
	for n := 0; n < batchSize; n++ {
		select {
		case r := <-receipts:
			if r.err != nil {
				t.Fatalf("send %d: %v", r.i, r.err)
			}
			ids[r.i] = r.id
		case <-time.After(30 * time.Second):
			t.Fatalf("only %d of %d send callbacks ran", n, batchSize)
		}
	}
	for i, id := range ids {
		if id.LedgerID() != ids[0].LedgerID() || id.EntryID() != ids[0].EntryID() || int(id.BatchIdx()) != i {
			t.Fatalf("the %d messages were not stored as one batch: message %d has id %v, message 0 %v",
				batchSize, i, id, ids[0])
		}
	}
}

func batchPayload(topic string, i int) string {
	return fmt.Sprintf("%s#%d", localName(topic), i)
}

func subscribeBatchIndexAck(t *testing.T, c pulsar.Client, topic string, subType pulsar.SubscriptionType) pulsar.Consumer {
	t.Helper()
	return subscribe(t, c, pulsar.ConsumerOptions{
		Topic:                          topic,
		SubscriptionName:               "batch-index-ack",
		Type:                           subType,
		EnableBatchIndexAcknowledgment: true,
		AckWithResponse:                true, // Ack returns once the broker answered
	})
}

// expectBatchIndexes receives exactly the messages of the batch at the given indexes,
// in order, and then nothing more.
func expectBatchIndexes(t *testing.T, cons pulsar.Consumer, topic string, indexes []int) []pulsar.Message {
	t.Helper()
	got := make([]pulsar.Message, 0, len(indexes))
	for _, want := range indexes {
		ctx, cancel := context.WithTimeout(context.Background(), receiveTimeout)
		m, err := cons.Receive(ctx)
		cancel()
		if err != nil {
			t.Fatalf("expected batch indexes %v; received only %d of them (%v): %v",
				indexes, len(got), payloadsOf(got), err)
		}
		if string(m.Payload()) != batchPayload(topic, want) || int(m.ID().BatchIdx()) != want {
			t.Fatalf("expected batch indexes %v; message %d is %q (id %v), want %q at batch index %d "+
				"(acknowledged messages of a batch came back, or unacknowledged ones were lost)",
				indexes, len(got), m.Payload(), m.ID(), batchPayload(topic, want), want)
		}
		got = append(got, m)
	}
	assertNothingMore(t, cons)
	return got
}

func payloadsOf(msgs []pulsar.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = string(m.Payload())
	}
	return out
}

// batchAckPhase1 publishes one batch on topic, receives it whole and acknowledges part
// of it (sc.ack); the consumer is closed afterwards.
func batchAckPhase1(t *testing.T, c pulsar.Client, topic string, sc batchAckScenario) {
	t.Helper()
	publishOneBatch(t, c, topic)
	cons := subscribeBatchIndexAck(t, c, topic, sc.subType)
	all := make([]int, batchSize)
	for i := range all {
		all[i] = i
	}
	msgs := expectBatchIndexes(t, cons, topic, all)
	for _, m := range msgs {
		if m.ID().BatchSize() != batchSize {
			t.Fatalf("message %v: batch size %d, want %d", m.ID(), m.ID().BatchSize(), batchSize)
		}
	}
	sc.ack(t, cons, msgs)
	cons.Close()
}

// batchAckPhase2 re-subscribes: exactly the unacknowledged messages come back; once
// they are acknowledged too, nothing comes back.
func batchAckPhase2(t *testing.T, c pulsar.Client, topic string, sc batchAckScenario) {
	t.Helper()
	cons := subscribeBatchIndexAck(t, c, topic, sc.subType)
	rest := expectBatchIndexes(t, cons, topic, sc.remaining)
	if sc.subType == pulsar.Exclusive {
		if err := cons.AckCumulative(rest[len(rest)-1]); err != nil {
			t.Fatalf("cumulative ack of the rest: %v", err)
		}
	} else {
		for _, m := range rest {
			ack(t, cons, m)
		}
	}
	cons.Close()
	cons = subscribeBatchIndexAck(t, c, topic, sc.subType)
	assertNothingMore(t, cons)
}

// Acknowledging part of a batch, then closing and re-subscribing: the other messages of
// the batch come back, the acknowledged ones do not.
func TestBatchIndexAck(t *testing.T) {
	for _, sc := range batchAckScenarios {
		t.Run(sc.name, func(t *testing.T) {
			c := newClient(t)
			topic := uniqueTopic("bidx-" + sc.name)
			batchAckPhase1(t, c, topic, sc)
			batchAckPhase2(t, c, topic, sc)
		})
	}
}
