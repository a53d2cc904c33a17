package compat

import (
	"fmt"
	"sort"
	"testing"

	"github.com/apache/pulsar-client-go/pulsar"
)

// A client whose service URL is the broker's HTTP address (http://host:webPort) looks
// topics up over HTTP: partitioned metadata with
//
//	GET /admin/v2/persistent/{tenant}/{ns}/{topic}/partitions?checkAllowAutoCreation=true
//
// and the owning broker with
//
//	GET /lookup/v2/topic/persistent/{tenant}/{ns}/{topic}
//
// (answer {"brokerUrl": "pulsar://...", "httpUrl": "http://...", ...}), then speaks the
// binary protocol to that broker. Pulsar serves both on its web port.
func TestHTTPServiceURL(t *testing.T) {
	c := newClientURL(t, webURL(t))

	t.Run("non-partitioned", func(t *testing.T) {
		topic := uniqueTopic("http-lookup")
		cons := subscribe(t, c, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s"})
		p := newProducer(t, c, pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
		for i := 0; i < 3; i++ {
			send(t, p, &pulsar.ProducerMessage{Payload: []byte(fmt.Sprint(i))})
		}
		for i, m := range receiveN(t, cons, 3) {
			if string(m.Payload()) != fmt.Sprint(i) {
				t.Fatalf("message %d is %q", i, m.Payload())
			}
			ack(t, cons, m)
		}
		assertNothingMore(t, cons)
	})

	t.Run("partitioned", func(t *testing.T) {
		const n = 3
		topic := uniqueTopic("http-lookup-parted")
		createPartitioned(t, topic, n)
		cons := subscribe(t, c, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s"})
		p := newProducer(t, c, pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
		want := []string{}
		for i := 0; i < 2*n; i++ {
			body := fmt.Sprintf("p-%d", i)
			want = append(want, body)
			send(t, p, &pulsar.ProducerMessage{Payload: []byte(body), Key: fmt.Sprintf("k%d", i)})
		}
		var got []string
		partitions := map[string]bool{}
		for _, m := range receiveN(t, cons, 2*n) {
			got = append(got, string(m.Payload()))
			partitions[m.Topic()] = true
			ack(t, cons, m)
		}
		sort.Strings(got)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("received %v, want %v", got, want)
		}
		if len(partitions) < 2 {
			t.Fatalf("all messages came from %v: the client did not see the %d partitions", partitions, n)
		}
		assertNothingMore(t, cons)
	})
}
