//go:build replicated

package compat

// Tests that need a broker whose ledgers are replicated on storage nodes and roll over often.
// tests/compat/test_replicated.py starts etcd, the nodes and such a broker
// (max_entries_per_ledger = MAGNETAR_TEST_ENTRIES_PER_LEDGER, write and ack quorum 2) and runs
// them; the build tag keeps them out of the plain `go test ./...` run against the standalone.

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

// The Go client, like every official one, closes the connection when a receipt comes for a
// later message than the oldest one pending, and resends what is pending: the topic then stores
// those messages twice. At a ledger rollover the next ledger's first entries can be durable on
// its nodes before the full ledger's last ones; their receipts must still come in send order.
func TestReceiptsInOrderAcrossRollovers(t *testing.T) {
	perLedger, err := strconv.Atoi(os.Getenv("MAGNETAR_TEST_ENTRIES_PER_LEDGER"))
	if err != nil || perLedger <= 0 {
		t.Fatalf("MAGNETAR_TEST_ENTRIES_PER_LEDGER is not a count: %q (run through tests/compat/test_replicated.py)",
			os.Getenv("MAGNETAR_TEST_ENTRIES_PER_LEDGER"))
	}
	const n = 5000
	c := newClient(t)
	topic := uniqueTopic("rollovers")
	p := newProducer(t, c, pulsar.ProducerOptions{
		Topic:              topic,
		DisableBatching:    true,
		MaxPendingMessages: 2000,
		SendTimeout:        30 * time.Second,
	})

	type answer struct {
		index int
		id    pulsar.MessageID
		err   error
	}
	answers := make(chan answer, n)
	for i := 0; i < n; i++ {
		i := i
		p.SendAsync(context.Background(), &pulsar.ProducerMessage{Payload: []byte(strconv.Itoa(i))},
			func(id pulsar.MessageID, _ *pulsar.ProducerMessage, err error) {
				answers <- answer{i, id, err}
			})
	}
	if err := p.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}

	deadline := time.After(60 * time.Second)
	var previous pulsar.MessageID
	ledgers := map[int64]bool{}
	for k := 0; k < n; k++ {
		var a answer
		select {
		case a = <-answers:
		case <-deadline:
			t.Fatalf("only %d of %d sends answered within 60 s", k, n)
		}
		if a.err != nil {
			t.Fatalf("send %d failed: %v", a.index, a.err)
		}
		if a.index != k {
			t.Fatalf("answer %d is for send %d: not in send order", k, a.index)
		}
		if previous != nil && !positionBefore(previous, a.id) {
			t.Fatalf("send %d stored at %d:%d, not after send %d at %d:%d", k,
				a.id.LedgerID(), a.id.EntryID(), k-1, previous.LedgerID(), previous.EntryID())
		}
		previous = a.id
		ledgers[a.id.LedgerID()] = true
	}
	if len(ledgers) < n/perLedger {
		t.Fatalf("the sends crossed %d ledgers, expected at least %d", len(ledgers), n/perLedger)
	}

	cons := subscribe(t, c, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "all"})
	for i := 0; i < n; i++ {
		m := receive(t, cons, receiveTimeout)
		if got := string(m.Payload()); got != strconv.Itoa(i) {
			t.Fatalf("message %d is %q: every message once, in order", i, got)
		}
		cons.Ack(m)
	}
	// And nothing more: a resent message would be a second copy.
	ctx, cancel := context.WithTimeout(context.Background(), quietPeriod)
	defer cancel()
	if m, err := cons.Receive(ctx); err == nil {
		t.Fatalf("a message after all %d: %q at %d:%d (stored twice)", n, m.Payload(),
			m.ID().LedgerID(), m.ID().EntryID())
	}
	t.Logf("%d sends over %d ledgers, answered and stored in order, each once", n, len(ledgers))
}

func positionBefore(a, b pulsar.MessageID) bool {
	if a.LedgerID() != b.LedgerID() {
		return a.LedgerID() < b.LedgerID()
	}
	return a.EntryID() < b.EntryID()
}
