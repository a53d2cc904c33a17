package compat

import (
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

// Failover subscriptions and ConsumerOptions.EventListener (ACTIVE_CONSUMER_CHANGE).
//
// Pulsar (AbstractDispatcherSingleActiveConsumer / PersistentDispatcherSingleActiveConsumer)
// picks the active consumer of a partition by sorting the consumers by priority level and
// name and taking partitionIndex % count; when that changes it waits
// activeConsumerFailoverDelayTimeMillis (default 1000 ms) before it rewinds, tells every
// consumer who is active (ACTIVE_CONSUMER_CHANGE) and dispatches to the new one. So the
// notifications reach a new consumer well after its SUBSCRIBE's SUCCESS; the Go client
// only knows the consumer from that SUCCESS on, and drops an ACTIVE_CONSUMER_CHANGE that
// comes earlier ("Consumer not found while active consumer change").
//
// A one-partition partitioned topic is used so the choice is the same on Pulsar and
// Magnetar (on a non-partitioned topic Pulsar hashes consumer names onto a ring).

type activeEvent struct {
	active bool
	at     time.Time
	topic  string
}

type eventRecorder struct{ events chan activeEvent }

func newEventRecorder() *eventRecorder { return &eventRecorder{events: make(chan activeEvent, 64)} }

func (r *eventRecorder) BecameActive(_ pulsar.Consumer, topic string, _ int32) {
	r.events <- activeEvent{true, time.Now(), topic}
}

func (r *eventRecorder) BecameInactive(_ pulsar.Consumer, topic string, _ int32) {
	r.events <- activeEvent{false, time.Now(), topic}
}

func (r *eventRecorder) next(t *testing.T, who string, timeout time.Duration) activeEvent {
	t.Helper()
	select {
	case e := <-r.events:
		return e
	case <-time.After(timeout):
		t.Fatalf("consumer %s got no ACTIVE_CONSUMER_CHANGE notification within %v", who, timeout)
		return activeEvent{}
	}
}

func TestFailoverActiveConsumerChange(t *testing.T) {
	const failoverDelay = time.Second // Pulsar's activeConsumerFailoverDelayTimeMillis
	const slack = 100 * time.Millisecond
	topic := uniqueTopic("failover")
	createPartitioned(t, topic, 1)
	c := newClient(t)
	p := newProducer(t, c, pulsar.ProducerOptions{Topic: topic, DisableBatching: true})

	// "b" alone: it is the active consumer and gets the messages.
	recB := newEventRecorder()
	consB := subscribe(t, c, pulsar.ConsumerOptions{
		Topic: topic, SubscriptionName: "fo", Type: pulsar.Failover, Name: "b-consumer",
		EventListener: recB, AckWithResponse: true,
	})
	send(t, p, &pulsar.ProducerMessage{Payload: []byte("m1")})
	if m := receive(t, consB, receiveTimeout); string(m.Payload()) != "m1" {
		t.Fatalf("b received %q", m.Payload())
	} else {
		ack(t, consB, m)
	}
	// (Pulsar tells it before dispatching; whatever arrived by now says active.)
	for drained := false; !drained; {
		select {
		case e := <-recB.events:
			if !e.active {
				t.Fatalf("b, the only consumer, was told it is inactive")
			}
		default:
			drained = true
		}
	}

	// "a" joins: sorted first by name, it takes over partition 0, after the failover delay.
	recA := newEventRecorder()
	joined := time.Now()
	consA := subscribe(t, c, pulsar.ConsumerOptions{
		Topic: topic, SubscriptionName: "fo", Type: pulsar.Failover, Name: "a-consumer",
		EventListener: recA, AckWithResponse: true,
	})
	// (A late "active" for b, from when it was alone, may still be on its way: skip it.)
	eB := recB.next(t, "b (told inactive when a takes over)", 10*time.Second)
	for eB.active {
		eB = recB.next(t, "b (told inactive when a takes over)", 10*time.Second)
	}
	if d := eB.at.Sub(joined); d < failoverDelay-slack {
		t.Fatalf("b was told it is inactive %v after a subscribed; Pulsar switches after "+
			"activeConsumerFailoverDelayTimeMillis (%v)", d, failoverDelay)
	}
	eA := recA.next(t, "a (told active after its SUBSCRIBE succeeded)", 10*time.Second)
	if !eA.active {
		t.Fatalf("a was told it is inactive; want active (a sorts first)")
	}
	if d := eA.at.Sub(joined); d < failoverDelay-slack {
		t.Fatalf("a was told it is active %v after subscribing; Pulsar switches after "+
			"activeConsumerFailoverDelayTimeMillis (%v)", d, failoverDelay)
	}

	// The messages now go to a.
	send(t, p, &pulsar.ProducerMessage{Payload: []byte("m2")})
	if m := receive(t, consA, receiveTimeout); string(m.Payload()) != "m2" {
		t.Fatalf("a received %q, want m2", m.Payload())
	} else {
		ack(t, consA, m)
	}
	assertNothingMore(t, consB)

	// a leaves: b is active again (told so, after the delay) and gets the next message.
	consA.Close()
	left := time.Now()
	eB = recB.next(t, "b (active again when a leaves)", 10*time.Second)
	if !eB.active {
		t.Fatalf("b was told it is inactive after a left")
	}
	if d := eB.at.Sub(left); d < failoverDelay-slack {
		t.Fatalf("b was told it is active %v after a left; Pulsar switches after "+
			"activeConsumerFailoverDelayTimeMillis (%v)", d, failoverDelay)
	}
	send(t, p, &pulsar.ProducerMessage{Payload: []byte("m3")})
	if m := receive(t, consB, receiveTimeout); string(m.Payload()) != "m3" {
		t.Fatalf("b received %q, want m3", m.Payload())
	}
}

// One Failover consumer on a 3-partition topic hears "became active" for every partition (the
// Go client's TestPartitionTopic_ActiveConsumerChanged). Its partition consumers subscribe on
// one connection at once, and each registers for events only after reading its SUBSCRIBE's
// success: a notification sent right behind the success is dropped ("Consumer not found while
// active consumer change"), so the broker tells a first pick after the failover delay, as
// Pulsar does.
func TestPartitionedFailoverConsumerBecomesActiveOnEveryPartition(t *testing.T) {
	topic := uniqueTopic("failover-partitions")
	createPartitioned(t, topic, 3)
	c := newClient(t)
	rec := newEventRecorder()
	subscribe(t, c, pulsar.ConsumerOptions{
		Topic: topic, SubscriptionName: "fo", Type: pulsar.Failover, EventListener: rec,
	})
	active := map[string]bool{}
	for len(active) < 3 {
		e := rec.next(t, "on a 3-partition topic", 10*time.Second)
		if !e.active {
			t.Fatalf("the only consumer was told it is inactive on %s", e.topic)
		}
		active[e.topic] = true
	}
}
