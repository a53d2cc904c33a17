package compat

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

// Batched and unbatched producers, with and without keys: every message arrives
// once, in order, with its key, properties and exact bytes (no schema: raw bytes).
func TestProduceConsume(t *testing.T) {
	cases := []struct {
		name     string
		batching bool
		keyed    bool
		count    int
	}{
		{"batched-keyed", true, true, 200},
		{"batched-unkeyed", true, false, 200},
		{"unbatched-keyed", false, true, 30},
		{"unbatched-unkeyed", false, false, 30},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newClient(t)
			topic := uniqueTopic("pc")
			cons := subscribe(t, c, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s"})
			p := newProducer(t, c, pulsar.ProducerOptions{
				Topic:                   topic,
				DisableBatching:         !tc.batching,
				BatchingMaxMessages:     50,
				BatchingMaxPublishDelay: 20 * time.Millisecond,
			})
			// Async sends so the batching producer really groups messages.
			errs := make(chan error, tc.count)
			for i := 0; i < tc.count; i++ {
				msg := &pulsar.ProducerMessage{
					Payload:    []byte(fmt.Sprintf("m-%04d", i)),
					Properties: map[string]string{"i": fmt.Sprint(i)},
				}
				if tc.keyed {
					msg.Key = fmt.Sprintf("k%d", i%7)
				}
				p.SendAsync(context.Background(), msg, func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) {
					errs <- err
				})
			}
			if err := p.FlushWithCtx(ctxTimeout(t, 30*time.Second)); err != nil {
				t.Fatalf("flush: %v", err)
			}
			for i := 0; i < tc.count; i++ {
				select {
				case err := <-errs:
					if err != nil {
						t.Fatalf("send %d: %v", i, err)
					}
				case <-time.After(30 * time.Second):
					t.Fatalf("only %d of %d send callbacks ran", i, tc.count)
				}
			}
			batched := 0
			for i, m := range receiveN(t, cons, tc.count) {
				if want := fmt.Sprintf("m-%04d", i); string(m.Payload()) != want {
					t.Fatalf("message %d: got %q, want %q", i, m.Payload(), want)
				}
				if m.Properties()["i"] != fmt.Sprint(i) {
					t.Fatalf("message %d: properties %v", i, m.Properties())
				}
				wantKey := ""
				if tc.keyed {
					wantKey = fmt.Sprintf("k%d", i%7)
				}
				if m.Key() != wantKey {
					t.Fatalf("message %d: key %q, want %q", i, m.Key(), wantKey)
				}
				if m.ID().BatchSize() > 1 {
					batched++
				}
				ack(t, cons, m)
			}
			if tc.batching && batched == 0 {
				t.Fatalf("batching producer: no message arrived inside a batch")
			}
			if !tc.batching && batched != 0 {
				t.Fatalf("non-batching producer: %d messages arrived inside batches", batched)
			}
			assertNothingMore(t, cons)
		})
	}
}

// Schema-less topics carry arbitrary bytes, including NULs, 0xff and empty payloads.
func TestRawBytes(t *testing.T) {
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	payloads := [][]byte{all, {0}, {0xff, 0xfe, 0x00, 0x80}, bytes.Repeat([]byte{0}, 4096)}
	c := newClient(t)
	topic := uniqueTopic("bytes")
	cons := subscribe(t, c, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s"})
	p := newProducer(t, c, pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
	for _, b := range payloads {
		send(t, p, &pulsar.ProducerMessage{Payload: b})
	}
	for i, m := range receiveN(t, cons, len(payloads)) {
		if !bytes.Equal(m.Payload(), payloads[i]) {
			t.Fatalf("payload %d changed: got %x, want %x", i, m.Payload(), payloads[i])
		}
		ack(t, cons, m)
	}
}

// A Shared subscription splits the messages between its consumers, each message
// delivered to exactly one of them.
func TestSharedSubscription(t *testing.T) {
	const n = 100
	c := newClient(t)
	topic := uniqueTopic("shared")
	opts := pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s", Type: pulsar.Shared, ReceiverQueueSize: 10}
	a := subscribe(t, c, opts)
	b := subscribe(t, c, opts)
	p := newProducer(t, c, pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
	for i := 0; i < n; i++ {
		send(t, p, &pulsar.ProducerMessage{Payload: []byte(fmt.Sprint(i)), Key: fmt.Sprint(i)})
	}
	seen := map[string]string{}
	perConsumer := map[string]int{}
	ctx := ctxTimeout(t, 30*time.Second)
	for len(seen) < n {
		var cm pulsar.ConsumerMessage
		select {
		case cm = <-a.Chan():
		case cm = <-b.Chan():
		case <-ctx.Done():
			t.Fatalf("shared: received %d of %d distinct messages", len(seen), n)
		}
		who := "a"
		if cm.Consumer == b {
			who = "b"
		}
		if prev, dup := seen[string(cm.Payload())]; dup {
			t.Fatalf("message %s delivered twice (%s then %s)", cm.Payload(), prev, who)
		}
		seen[string(cm.Payload())] = who
		perConsumer[who]++
		if err := cm.Consumer.Ack(cm.Message); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
	if perConsumer["a"] == 0 || perConsumer["b"] == 0 {
		t.Fatalf("shared subscription did not split the messages: %v", perConsumer)
	}
	assertNothingMore(t, a)
	assertNothingMore(t, b)
}

// A negatively acknowledged message comes back after NackRedeliveryDelay (the
// delay is the client's), with its redelivery count raised by the broker.
func TestNackRedeliveryDelay(t *testing.T) {
	const delay = 500 * time.Millisecond
	// By default the client rounds the redelivery time down to 256 ms buckets
	// (8 precision bits); exact timing makes the delay assertable.
	exact := int64(0)
	c := newClient(t)
	topic := uniqueTopic("nack")
	cons := subscribe(t, c, pulsar.ConsumerOptions{
		Topic: topic, SubscriptionName: "s", Type: pulsar.Shared, NackRedeliveryDelay: delay,
		NackPrecisionBit: &exact,
	})
	p := newProducer(t, c, pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
	send(t, p, &pulsar.ProducerMessage{Payload: []byte("again")})
	send(t, p, &pulsar.ProducerMessage{Payload: []byte("once")})
	msgs := receiveN(t, cons, 2)
	if string(msgs[0].Payload()) != "again" || msgs[0].RedeliveryCount() != 0 {
		t.Fatalf("first delivery: %q count %d", msgs[0].Payload(), msgs[0].RedeliveryCount())
	}
	nackedAt := time.Now()
	cons.Nack(msgs[0])
	ack(t, cons, msgs[1])
	m := receive(t, cons, receiveTimeout)
	elapsed := time.Since(nackedAt)
	if string(m.Payload()) != "again" {
		t.Fatalf("redelivered %q, want \"again\"", m.Payload())
	}
	if m.RedeliveryCount() != 1 {
		t.Fatalf("redelivery count %d, want 1", m.RedeliveryCount())
	}
	if !sameEntry(m.ID(), msgs[0].ID()) {
		t.Fatalf("redelivered id %v, want %v", m.ID(), msgs[0].ID())
	}
	if elapsed < delay {
		t.Fatalf("redelivered after %v, before the nack delay %v", elapsed, delay)
	}
	ack(t, cons, m)
	assertNothingMore(t, cons)
}

// SeekByTime rewinds a subscription to the first message published at or after
// the time; acknowledged messages after it are delivered again.
func TestSeekByTime(t *testing.T) {
	c := newClient(t)
	topic := uniqueTopic("seektime")
	cons := subscribe(t, c, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s"})
	p := newProducer(t, c, pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
	for i := 0; i < 5; i++ {
		send(t, p, &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("old-%d", i))})
	}
	first := receiveN(t, cons, 5)
	lastOld := first[4].PublishTime()
	// Publish times have millisecond resolution: make sure the next messages get
	// a later one than every old message (a clock condition, not synchronisation).
	waitClockPast(t, lastOld)
	var newIDs []pulsar.MessageID
	for i := 0; i < 5; i++ {
		newIDs = append(newIDs, send(t, p, &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("new-%d", i))}))
	}
	second := receiveN(t, cons, 5)
	for _, m := range append(first, second...) {
		ack(t, cons, m)
	}
	seekTo := second[0].PublishTime()
	if !seekTo.After(lastOld) {
		t.Fatalf("publish times not increasing: old %v, new %v", lastOld, seekTo)
	}
	if err := cons.SeekByTime(seekTo); err != nil {
		t.Fatalf("seek by time: %v", err)
	}
	again := receiveN(t, cons, 5)
	for i, m := range again {
		if want := fmt.Sprintf("new-%d", i); string(m.Payload()) != want {
			t.Fatalf("after seek, message %d is %q, want %q", i, m.Payload(), want)
		}
		if !sameEntry(m.ID(), newIDs[i]) {
			t.Fatalf("after seek, message %d has id %v, want %v", i, m.ID(), newIDs[i])
		}
		ack(t, cons, m)
	}
	assertNothingMore(t, cons)
}

// A reader started inclusively at a message id reads that message first; with
// LatestMessageID and StartMessageIDInclusive it reads the last message (the
// client asks the broker for it with GET_LAST_MESSAGE_ID). HasNext is false at
// the end.
func TestReaderInclusiveAndLastMessageID(t *testing.T) {
	c := newClient(t)
	topic := uniqueTopic("reader")
	p := newProducer(t, c, pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
	var ids []pulsar.MessageID
	for i := 0; i < 10; i++ {
		ids = append(ids, send(t, p, &pulsar.ProducerMessage{Payload: []byte(fmt.Sprint(i))}))
	}
	cases := []struct {
		name      string
		start     pulsar.MessageID
		inclusive bool
		first     int
	}{
		{"inclusive-at-4", ids[4], true, 4},
		{"exclusive-at-4", ids[4], false, 5},
		{"earliest", pulsar.EarliestMessageID(), false, 0},
		{"latest-inclusive", pulsar.LatestMessageID(), true, 9},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := c.CreateReader(pulsar.ReaderOptions{
				Topic: topic, StartMessageID: tc.start, StartMessageIDInclusive: tc.inclusive,
			})
			if err != nil {
				t.Fatalf("reader: %v", err)
			}
			defer r.Close()
			for i := tc.first; i < 10; i++ {
				if !r.HasNext() {
					t.Fatalf("HasNext false before message %d", i)
				}
				m := readNext(t, r)
				if string(m.Payload()) != fmt.Sprint(i) || !sameEntry(m.ID(), ids[i]) {
					t.Fatalf("read %q (%v), want %d (%v)", m.Payload(), m.ID(), i, ids[i])
				}
			}
			if r.HasNext() {
				t.Fatalf("HasNext true after the last message")
			}
		})
	}

	cons := subscribe(t, c, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "last"})
	last, err := cons.GetLastMessageIDs()
	if err != nil {
		t.Fatalf("GetLastMessageIDs: %v", err)
	}
	if len(last) != 1 || !sameEntry(last[0], ids[9]) {
		t.Fatalf("GetLastMessageIDs = %v, want [%v]", last, ids[9])
	}

	// An empty topic has no last message: the reader has nothing next.
	empty := uniqueTopic("reader-empty")
	newProducer(t, c, pulsar.ProducerOptions{Topic: empty})
	r, err := c.CreateReader(pulsar.ReaderOptions{Topic: empty, StartMessageID: pulsar.EarliestMessageID()})
	if err != nil {
		t.Fatalf("reader on empty topic: %v", err)
	}
	defer r.Close()
	if r.HasNext() {
		t.Fatalf("HasNext true on an empty topic")
	}
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitClockPast returns once the wall clock (in ms) is later than ts.
func waitClockPast(t *testing.T, ts time.Time) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !time.Now().Truncate(time.Millisecond).After(ts) {
		if time.Now().After(deadline) {
			t.Fatalf("clock did not pass %v", ts)
		}
		time.Sleep(time.Millisecond)
	}
}

// With AckWithResponse the client waits for the broker's ACK_RESPONSE: individual
// and cumulative acks both succeed and are durable across a reconnect; Unsubscribe
// removes the subscription, so a new one with the same name starts over.
func TestAckWithResponseAndUnsubscribe(t *testing.T) {
	c := newClient(t)
	topic := uniqueTopic("ackresp")
	p := newProducer(t, c, pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
	for i := 0; i < 6; i++ {
		send(t, p, &pulsar.ProducerMessage{Payload: []byte(fmt.Sprint(i))})
	}
	opts := pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s", AckWithResponse: true}
	cons := subscribe(t, c, opts)
	msgs := receiveN(t, cons, 6)
	ack(t, cons, msgs[0])
	if err := cons.AckCumulative(msgs[3]); err != nil {
		t.Fatalf("cumulative ack with response: %v", err)
	}
	cons.Close()

	cons = subscribe(t, c, opts)
	rest := receiveN(t, cons, 2)
	for i, m := range rest {
		if want := fmt.Sprint(4 + i); string(m.Payload()) != want {
			t.Fatalf("after reconnect, message %d is %q, want %q", i, m.Payload(), want)
		}
	}
	assertNothingMore(t, cons)
	if err := cons.Unsubscribe(); err != nil {
		t.Fatalf("unsubscribe: %v", err)
	}
	cons.Close()

	cons = subscribe(t, c, opts)
	if got := receiveN(t, cons, 6); string(got[0].Payload()) != "0" {
		t.Fatalf("new subscription starts at %q, want \"0\"", got[0].Payload())
	}
}
