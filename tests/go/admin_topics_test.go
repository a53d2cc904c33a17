package compat

import (
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

// Admin REST create and delete of topics, as pulsar-admin does them:
//   PUT    /admin/v2/persistent/{tenant}/{ns}/{topic}             creates a non-partitioned topic
//   DELETE /admin/v2/persistent/{tenant}/{ns}/{topic}             deletes it, data and subscriptions
//   PUT    /admin/v2/persistent/{tenant}/{ns}/{topic}/partitions  creates a partitioned topic
//   DELETE /admin/v2/persistent/{tenant}/{ns}/{topic}/partitions  deletes it with its partitions
// A created topic is listed by GET /admin/v2/persistent/{tenant}/{ns} and by the binary
// protocol's GET_TOPICS_OF_NAMESPACE (what pattern consumers subscribe from); a deleted one
// is not, and a topic created again under the same name starts empty.

// patternFinds subscribes a pattern consumer matching topic (and its partitions)
// with discovery effectively off: it only subscribes to what GET_TOPICS_OF_NAMESPACE
// lists right now. It then publishes one message to topic and reports whether the
// pattern consumer received it.
func patternFinds(t *testing.T, c pulsar.Client, topic string) bool {
	t.Helper()
	// (The client parses the pattern as a topic name, so it must not contain "-partition-";
	// the random topic name makes ".*" match only the topic and its partitions.)
	pattern := "persistent://public/default/" + regexp.QuoteMeta(localName(topic)) + ".*"
	cons, err := c.Subscribe(pulsar.ConsumerOptions{
		TopicsPattern:               pattern,
		SubscriptionName:            "pattern-probe",
		SubscriptionInitialPosition: pulsar.SubscriptionPositionLatest,
		AutoDiscoveryPeriod:         time.Hour,
	})
	if err != nil {
		t.Fatalf("pattern consumer %s: %v", pattern, err)
	}
	defer cons.Close()
	p, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
	if err != nil {
		t.Fatalf("producer on %s: %v", topic, err)
	}
	defer p.Close()
	body := "probe-" + localName(uniqueTopic("x"))
	send(t, p, &pulsar.ProducerMessage{Payload: []byte(body)})
	ctx := ctxTimeout(t, 5*time.Second)
	for {
		m, err := cons.Receive(ctx)
		if err != nil {
			return false
		}
		if string(m.Payload()) == body {
			_ = cons.Ack(m)
			return true
		}
	}
}

func TestAdminCreateAndDeleteTopic(t *testing.T) {
	topic := uniqueTopic("admin-topic")
	path := "/admin/v2/persistent/public/default/" + localName(topic)

	adminOK(t, "PUT", path, "")
	if got := namespaceTopics(t, false); !contains(got, topic) {
		t.Fatalf("after PUT %s, GET /admin/v2/persistent/public/default does not list %s: %v", path, topic, got)
	}
	if status, body := adminDo(t, "PUT", path, ""); status != 409 {
		t.Fatalf("PUT %s again answered %d %q, want 409 (it exists)", path, status, body)
	}

	c := newClientURL(t, serviceURL(t))
	if !patternFinds(t, c, topic) {
		t.Fatalf("a pattern consumer subscribed after PUT %s did not find the topic "+
			"(GET_TOPICS_OF_NAMESPACE does not list it)", path)
	}
	// Some data and a subscription, then every client closes.
	p := newProducer(t, c, pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
	for i := 0; i < 3; i++ {
		send(t, p, &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("old-%d", i))})
	}
	cons := subscribe(t, c, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "old-sub"})
	receive(t, cons, receiveTimeout)
	c.Close()

	adminOK(t, "DELETE", path, "")
	if got := namespaceTopics(t, false); contains(got, topic) {
		t.Fatalf("after DELETE %s, GET /admin/v2/persistent/public/default still lists it: %v", path, got)
	}
	if status, body := adminDo(t, "DELETE", path, ""); status != 404 {
		t.Fatalf("DELETE %s again answered %d %q, want 404 (it is gone)", path, status, body)
	}

	// Created again: no old messages, no old subscription.
	adminOK(t, "PUT", path, "")
	c2 := newClientURL(t, serviceURL(t))
	for _, sub := range []string{"fresh", "old-sub"} {
		cons := subscribe(t, c2, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: sub})
		assertNothingMore(t, cons)
		cons.Close()
	}
	p2 := newProducer(t, c2, pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
	send(t, p2, &pulsar.ProducerMessage{Payload: []byte("new-0")})
	cons2 := subscribe(t, c2, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "fresh2"})
	if m := receive(t, cons2, receiveTimeout); string(m.Payload()) != "new-0" {
		t.Fatalf("the re-created topic's first message is %q, want \"new-0\" (old data survived the delete)",
			m.Payload())
	}
	assertNothingMore(t, cons2)
}

func TestAdminDeletePartitionedTopic(t *testing.T) {
	const n = 3
	topic := uniqueTopic("admin-parted")
	path := "/admin/v2/persistent/public/default/" + localName(topic) + "/partitions"
	partitions := make([]string, n)
	for i := range partitions {
		partitions[i] = fmt.Sprintf("%s-partition-%d", topic, i)
	}

	adminOK(t, "PUT", path, fmt.Sprint(n))
	c := newClientURL(t, serviceURL(t))
	p := newProducer(t, c, pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
	for i := 0; i < 2*n; i++ {
		send(t, p, &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("old-%d", i))})
	}
	cons := subscribe(t, c, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "old-sub"})
	receive(t, cons, receiveTimeout)
	listed := namespaceTopics(t, false)
	for _, part := range partitions {
		if !contains(listed, part) {
			t.Fatalf("partition %s is not listed before the delete: %v", part, listed)
		}
	}
	if got := namespaceTopics(t, true); !contains(got, topic) {
		t.Fatalf("GET .../partitioned does not list %s: %v", topic, got)
	}
	c.Close()

	adminOK(t, "DELETE", path, "")
	listed = namespaceTopics(t, false)
	for _, part := range partitions {
		if contains(listed, part) {
			t.Fatalf("after DELETE %s, partition %s is still listed: %v", path, part, listed)
		}
	}
	if got := namespaceTopics(t, true); contains(got, topic) {
		t.Fatalf("after DELETE %s, GET .../partitioned still lists it: %v", path, got)
	}
	if status, body := adminDo(t, "GET", path, ""); status != 404 {
		t.Fatalf("GET %s after the delete answered %d %q, want 404", path, status, body)
	}
	// Created again with the same name: accepted, and empty.
	adminOK(t, "PUT", path, fmt.Sprint(n))
	c3 := newClientURL(t, serviceURL(t))
	cons3 := subscribe(t, c3, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "old-sub"})
	assertNothingMore(t, cons3)
	p3 := newProducer(t, c3, pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
	send(t, p3, &pulsar.ProducerMessage{Payload: []byte("new-0")})
	if m := receive(t, cons3, receiveTimeout); string(m.Payload()) != "new-0" {
		t.Fatalf("the re-created partitioned topic delivered %q, want \"new-0\"", m.Payload())
	}
	assertNothingMore(t, cons3)
}
