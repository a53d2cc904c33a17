package compat

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

// A chunking producer splits a large message into entries of at most
// ChunkMaxMessageSize (or the broker's max message size); the consumer
// reassembles it; acking the whole message acks every chunk, so a new consumer
// on the subscription gets nothing.
func TestChunking(t *testing.T) {
	cases := []struct {
		name      string
		size      int
		chunkSize uint // 0: the broker's max message size (5 MiB by default)
		minChunks int64
	}{
		{"100KiB-in-10KiB-chunks", 100 << 10, 10 << 10, 10},
		// each chunk holds less than 5 MiB of payload (its metadata counts too)
		{"20MiB-default-chunks", 20 << 20, 0, 5},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newClient(t)
			topic := uniqueTopic("chunk")
			cons, err := c.Subscribe(pulsar.ConsumerOptions{
				Topic: topic, SubscriptionName: "s",
				SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest,
			})
			if err != nil {
				t.Fatalf("subscribe: %v", err)
			}
			p := newProducer(t, c, pulsar.ProducerOptions{
				Topic: topic, DisableBatching: true, EnableChunking: true,
				ChunkMaxMessageSize: tc.chunkSize, SendTimeout: 60 * time.Second,
			})
			big := randomPayload(t, tc.size)
			send(t, p, &pulsar.ProducerMessage{Payload: big, Key: "big"})
			send(t, p, &pulsar.ProducerMessage{Payload: []byte("small-after")})

			m := receive(t, cons, 60*time.Second)
			if !bytes.Equal(m.Payload(), big) {
				t.Fatalf("chunked message: got %d bytes, want %d (equal: false)", len(m.Payload()), len(big))
			}
			if m.Key() != "big" {
				t.Fatalf("chunked message key %q", m.Key())
			}
			// On a new topic the entries are 0, 1, ...: the id of a chunked message is
			// that of its last chunk, and the next message follows it.
			if m.ID().EntryID() < tc.minChunks-1 {
				t.Fatalf("chunked message id %v: fewer than %d chunk entries", m.ID(), tc.minChunks)
			}
			small := receive(t, cons, receiveTimeout)
			if string(small.Payload()) != "small-after" {
				t.Fatalf("after the chunked message: %q", small.Payload())
			}
			if small.ID().EntryID() != m.ID().EntryID()+1 {
				t.Fatalf("message after the chunked one has id %v, chunked %v", small.ID(), m.ID())
			}
			ack(t, cons, m)
			ack(t, cons, small)
			cons.Close()

			// A new consumer on the same subscription: every chunk entry was acked.
			again := subscribe(t, c, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s"})
			assertNothingMore(t, again)

			// A reader still sees the whole message once.
			r, err := c.CreateReader(pulsar.ReaderOptions{Topic: topic, StartMessageID: pulsar.EarliestMessageID()})
			if err != nil {
				t.Fatalf("reader: %v", err)
			}
			defer r.Close()
			if rm := readNext(t, r); !bytes.Equal(rm.Payload(), big) {
				t.Fatalf("reader: chunked message of %d bytes, want %d", len(rm.Payload()), len(big))
			}
			if rm := readNext(t, r); string(rm.Payload()) != "small-after" {
				t.Fatalf("reader: %q after the chunked message", rm.Payload())
			}
		})
	}
}

// RetryEnable + ReconsumeLater: the message is re-published to
// <topic>-<subscription>-RETRY (which the consumer also subscribes to) with
// deliver-after set, comes back with RECONSUMETIMES raised, and after
// MaxDeliveries reconsumes it goes to <topic>-<subscription>-DLQ.
//
// The delay itself is asserted only with MAGNETAR_EXPECT_DELAYED=1 (delayed
// delivery on Shared subscriptions); without it, the routing is still checked.
func TestRetryTopicThenDLQ(t *testing.T) {
	const (
		maxDeliveries = 2
		delay         = 2 * time.Second
		// Pulsar may deliver a delayed message early by up to its tick time
		// (delayedDeliveryTickTimeMillis, 1 s by default, unless
		// isDelayedDeliveryDeliverAtTimeStrict).
		minDelay = delay - time.Second
	)
	expectDelay := os.Getenv("MAGNETAR_EXPECT_DELAYED") == "1"
	c := newClient(t)
	topic := uniqueTopic("retry")
	sub := "rs"
	retryTopic := topic + "-" + sub + "-RETRY"
	dlqTopic := topic + "-" + sub + "-DLQ"

	cons := subscribe(t, c, pulsar.ConsumerOptions{
		Topic: topic, SubscriptionName: sub, Type: pulsar.Shared, RetryEnable: true,
		DLQ: &pulsar.DLQPolicy{MaxDeliveries: maxDeliveries, InitialSubscriptionName: "dlq-sub"},
	})
	p := newProducer(t, c, pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
	origID := send(t, p, &pulsar.ProducerMessage{Payload: []byte("retry-me"), Properties: map[string]string{"app": "x"}})

	m := receive(t, cons, receiveTimeout)
	if string(m.Payload()) != "retry-me" || m.Topic() != topic {
		t.Fatalf("first delivery: %q from %s", m.Payload(), m.Topic())
	}
	for attempt := 1; attempt <= maxDeliveries; attempt++ {
		start := time.Now()
		cons.ReconsumeLater(m, delay)
		m = receive(t, cons, receiveTimeout+delay)
		elapsed := time.Since(start)
		if string(m.Payload()) != "retry-me" {
			t.Fatalf("retry %d: payload %q", attempt, m.Payload())
		}
		if m.Topic() != retryTopic {
			t.Fatalf("retry %d: came from %s, want %s", attempt, m.Topic(), retryTopic)
		}
		props := m.Properties()
		if props["RECONSUMETIMES"] != fmt.Sprint(attempt) || props["app"] != "x" ||
			props["REAL_TOPIC"] != topic || props["ORIGIN_MESSAGE_ID"] == "" {
			t.Fatalf("retry %d: properties %v", attempt, props)
		}
		if expectDelay && elapsed < minDelay {
			t.Fatalf("retry %d: redelivered after %v, delay %v", attempt, elapsed, delay)
		}
		t.Logf("retry %d arrived after %v (delay %v, asserted: %v)", attempt, elapsed, delay, expectDelay)
	}
	// One more reconsume exceeds MaxDeliveries: the message goes to the DLQ and
	// is acknowledged on the retry topic.
	cons.ReconsumeLater(m, delay)

	dlq := subscribe(t, c, pulsar.ConsumerOptions{Topic: dlqTopic, SubscriptionName: "dlq-sub"})
	d := receive(t, dlq, receiveTimeout)
	if string(d.Payload()) != "retry-me" || d.Properties()["REAL_TOPIC"] != topic {
		t.Fatalf("DLQ message %q with properties %v", d.Payload(), d.Properties())
	}
	if d.Properties()["ORIGIN_MESSAGE_ID"] == "" {
		t.Fatalf("DLQ message without ORIGIN_MESSAGE_ID: %v (original %v)", d.Properties(), origID)
	}
	ack(t, dlq, d)
	assertNothingMore(t, cons)

	// The client created both topics under the names above.
	names := listTopics(t)
	for _, want := range []string{retryTopic, dlqTopic} {
		if !contains(names, want) {
			t.Fatalf("topic %s not in the namespace listing %v", want, names)
		}
	}
}

func listTopics(t *testing.T) []string {
	t.Helper()
	client := http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(webURL(t) + "/admin/v2/persistent/public/default")
	if err != nil {
		t.Fatalf("list topics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("list topics: status %d, %v, %s", resp.StatusCode, err, body)
	}
	var names []string
	if err := json.Unmarshal(body, &names); err != nil {
		t.Fatalf("list topics: %v in %s", err, body)
	}
	return names
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if strings.EqualFold(x, s) {
			return true
		}
	}
	return false
}
