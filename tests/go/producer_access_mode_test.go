package compat

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

// Producer access modes (PIP-68). Pulsar's AbstractTopic.incrementTopicEpochIfNeeded:
//   - Exclusive while an exclusive producer holds the topic: ProducerFenced
//     "Topic has an existing exclusive producer: <name>";
//   - Exclusive while shared producers are connected: ProducerFenced
//     "Topic has existing shared producers";
//   - Shared while an exclusive producer holds the topic: ProducerBusy
//     "Topic has an existing exclusive producer: <name>";
//   - WaitForExclusive: answered at once with PRODUCER_SUCCESS(producer_ready=false),
//     then PRODUCER_SUCCESS(producer_ready=true) for the same request once the topic is
//     free. Only that producer waits: its connection keeps serving everything else.
// The Go client reports a refused producer as "server error: <ServerError>: <message>".

func createProducerErr(t *testing.T, c pulsar.Client, opts pulsar.ProducerOptions) error {
	t.Helper()
	var p pulsar.Producer
	var err error
	done := make(chan struct{})
	go func() {
		p, err = c.CreateProducer(opts)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("creating a %v producer on %s did not finish within 30 s", opts.ProducerAccessMode, opts.Topic)
	}
	if err == nil {
		p.Close()
		return nil
	}
	return err
}

func wantRefused(t *testing.T, err error, what, serverError, message string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: the producer was created, want it refused with %s %q", what, serverError, message)
	}
	if !strings.Contains(err.Error(), serverError) || !strings.Contains(err.Error(), message) {
		t.Fatalf("%s: refused with %q, want %s %q", what, err, serverError, message)
	}
}

func TestExclusiveProducerConflicts(t *testing.T) {
	c := newClient(t)
	topic := uniqueTopic("excl")
	holderName := "holder-" + localName(uniqueTopic("n"))
	holder := newProducer(t, c, pulsar.ProducerOptions{
		Topic: topic, Name: holderName, ProducerAccessMode: pulsar.ProducerAccessModeExclusive,
		DisableBatching: true,
	})

	err := createProducerErr(t, c, pulsar.ProducerOptions{
		Topic: topic, ProducerAccessMode: pulsar.ProducerAccessModeExclusive,
	})
	wantRefused(t, err, "second Exclusive producer", "ProducerFenced",
		"Topic has an existing exclusive producer: "+holderName)

	err = createProducerErr(t, c, pulsar.ProducerOptions{Topic: topic})
	wantRefused(t, err, "Shared producer on a topic with an exclusive producer", "ProducerBusy",
		"Topic has an existing exclusive producer: "+holderName)

	// The refusals did not disturb the holder.
	cons := subscribe(t, c, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s"})
	send(t, holder, &pulsar.ProducerMessage{Payload: []byte("still-exclusive")})
	if m := receive(t, cons, receiveTimeout); string(m.Payload()) != "still-exclusive" {
		t.Fatalf("received %q", m.Payload())
	}

	// Shared producers first: an Exclusive one is fenced off.
	shared := uniqueTopic("excl-shared")
	newProducer(t, c, pulsar.ProducerOptions{Topic: shared})
	err = createProducerErr(t, c, pulsar.ProducerOptions{
		Topic: shared, ProducerAccessMode: pulsar.ProducerAccessModeExclusive,
	})
	wantRefused(t, err, "Exclusive producer on a topic with a shared producer", "ProducerFenced",
		"Topic has existing shared producers")

	// Once the holder is gone the topic takes a new exclusive producer.
	holder.Close()
	if err := createProducerErr(t, c, pulsar.ProducerOptions{
		Topic: topic, ProducerAccessMode: pulsar.ProducerAccessModeExclusive,
	}); err != nil {
		t.Fatalf("Exclusive producer after the holder closed: %v", err)
	}
}

// A WaitForExclusive producer waits while another client holds the topic exclusively;
// meanwhile its client's connection keeps working for other producers and consumers.
func TestWaitForExclusiveProducer(t *testing.T) {
	const opBound = 10 * time.Second
	topic := uniqueTopic("wfe")
	other := uniqueTopic("wfe-other")

	a := newClient(t)
	holder := newProducer(t, a, pulsar.ProducerOptions{
		Topic: topic, Name: "holder-" + localName(topic), ProducerAccessMode: pulsar.ProducerAccessModeExclusive,
		DisableBatching: true,
	})
	reader := subscribe(t, a, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s"})
	send(t, holder, &pulsar.ProducerMessage{Payload: []byte("from-holder")})

	// Client B (one connection to the broker): a producer and a consumer on another
	// topic, then the waiting producer on the held topic.
	b := newClientURL(t, serviceURL(t))
	bCons := subscribe(t, b, pulsar.ConsumerOptions{Topic: other, SubscriptionName: "s"})
	bProd := newProducer(t, b, pulsar.ProducerOptions{Topic: other, DisableBatching: true})
	send(t, bProd, &pulsar.ProducerMessage{Payload: []byte("before")})
	if m := receive(t, bCons, receiveTimeout); string(m.Payload()) != "before" {
		t.Fatalf("received %q", m.Payload())
	}

	type created struct {
		p   pulsar.Producer
		err error
	}
	waiting := make(chan created, 1)
	go func() {
		p, err := b.CreateProducer(pulsar.ProducerOptions{
			Topic: topic, ProducerAccessMode: pulsar.ProducerAccessModeWaitForExclusive,
			DisableBatching: true,
		})
		waiting <- created{p, err}
	}()
	select {
	case r := <-waiting:
		if r.err == nil {
			r.p.Close()
		}
		t.Fatalf("the WaitForExclusive producer did not wait while another producer holds the topic "+
			"exclusively (err %v)", r.err)
	case <-time.After(quietPeriod):
	}

	// While it waits, the same connection serves the other producer and consumer...
	for i := 0; i < 3; i++ {
		want := fmt.Sprintf("during-wait-%d", i)
		ctx, cancel := context.WithTimeout(context.Background(), opBound)
		_, err := bProd.Send(ctx, &pulsar.ProducerMessage{Payload: []byte(want)})
		cancel()
		if err != nil {
			t.Fatalf("send on the waiting producer's connection: %v", err)
		}
		if m := receive(t, bCons, opBound); string(m.Payload()) != want {
			t.Fatalf("received %q, want %q", m.Payload(), want)
		}
	}
	// ...new consumers come and go...
	var extra pulsar.Consumer
	within(t, opBound, "subscribing on the waiting producer's connection", func() error {
		var err error
		extra, err = b.Subscribe(pulsar.ConsumerOptions{
			Topic: uniqueTopic("wfe-extra"), SubscriptionName: "s",
		})
		return err
	})
	within(t, opBound, "closing a consumer on the waiting producer's connection", func() error {
		extra.Close()
		return nil
	})
	within(t, opBound, "closing a consumer on the waiting producer's connection", func() error {
		bCons.Close()
		return nil
	})

	// ...and the producer is still waiting.
	select {
	case r := <-waiting:
		t.Fatalf("the WaitForExclusive producer finished waiting while the holder is connected (err %v)", r.err)
	default:
	}

	// The holder leaves: the waiting producer gets the topic and can send.
	holder.Close()
	var waiter pulsar.Producer
	select {
	case r := <-waiting:
		if r.err != nil {
			t.Fatalf("the WaitForExclusive producer failed once the topic was free: %v", r.err)
		}
		waiter = r.p
	case <-time.After(15 * time.Second):
		t.Fatalf("the WaitForExclusive producer was not ready within 15 s of the exclusive holder closing")
	}
	send(t, waiter, &pulsar.ProducerMessage{Payload: []byte("from-waiter")})
	for _, want := range []string{"from-holder", "from-waiter"} {
		if m := receive(t, reader, receiveTimeout); string(m.Payload()) != want {
			t.Fatalf("received %q, want %q", m.Payload(), want)
		}
	}
	// Others are refused while it holds the topic.
	wantRefused(t, createProducerErr(t, a, pulsar.ProducerOptions{
		Topic: topic, ProducerAccessMode: pulsar.ProducerAccessModeExclusive,
	}), "Exclusive producer while the former waiter holds the topic", "ProducerFenced",
		"Topic has an existing exclusive producer")

	// Client B goes away: the topic takes a new exclusive producer.
	within(t, 30*time.Second, "closing client B", func() error {
		b.Close()
		return nil
	})
	if err := createProducerErr(t, a, pulsar.ProducerOptions{
		Topic: topic, ProducerAccessMode: pulsar.ProducerAccessModeExclusive,
	}); err != nil {
		t.Fatalf("Exclusive producer after client B closed: %v", err)
	}
}
