//go:build brokers

package compat

// Three brokers as one service, with the official Go client: tests/compat/test_cluster_brokers.py
// starts etcd, storage nodes and three `magnetar broker`s, creates a namespace of four bundles
// with deduplication on, and runs this test with
//
//	MAGNETAR_TEST_SERVICE_URLS  pulsar://host:port of each broker, comma-separated
//	MAGNETAR_TEST_WEB_URLS      http://host:port of each broker's admin API, in the same order
//	MAGNETAR_TEST_NAMESPACE     tenant/namespace
//
// The build tag keeps it out of the plain `go test ./...` run against the standalone.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

func brokerList(t *testing.T, variable string) []string {
	t.Helper()
	value := os.Getenv(variable)
	if value == "" {
		t.Fatalf("%s is not set (run through tests/compat/test_cluster_brokers.py)", variable)
	}
	return strings.Split(value, ",")
}

func httpDo(t *testing.T, method, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// ownerAt is the broker URL `web`'s HTTP lookup answers for topic.
func ownerAt(t *testing.T, web, topic string) string {
	t.Helper()
	status, body := httpDo(t, http.MethodGet, web+"/lookup/v2/topic/"+strings.Replace(topic, "://", "/", 1))
	if status != 200 {
		t.Fatalf("lookup of %s at %s: %d %s", topic, web, status, body)
	}
	var answer struct {
		BrokerURL string `json:"brokerUrl"`
	}
	if err := json.Unmarshal([]byte(body), &answer); err != nil {
		t.Fatalf("lookup answer %q: %v", body, err)
	}
	return answer.BrokerURL
}

func produceAndConsume(t *testing.T, url, topic string, n int) {
	t.Helper()
	c := newClientURL(t, url)
	defer c.Close()
	p, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
	if err != nil {
		t.Fatalf("producer on %s through %s: %v", topic, url, err)
	}
	defer p.Close()
	cons, err := c.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s",
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest})
	if err != nil {
		t.Fatalf("subscribe to %s through %s: %v", topic, url, err)
	}
	defer cons.Close()
	for i := 0; i < n; i++ {
		send(t, p, &pulsar.ProducerMessage{Payload: []byte(strconv.Itoa(i))})
	}
	for i, m := range receiveN(t, cons, n) {
		if string(m.Payload()) != strconv.Itoa(i) {
			t.Fatalf("%s through %s: message %d is %q", topic, url, i, m.Payload())
		}
		ack(t, cons, m)
	}
}

func TestThreeBrokersAreOneService(t *testing.T) {
	services := brokerList(t, "MAGNETAR_TEST_SERVICE_URLS")
	webs := brokerList(t, "MAGNETAR_TEST_WEB_URLS")
	ns := os.Getenv("MAGNETAR_TEST_NAMESPACE")
	if len(services) != 3 || len(webs) != 3 || ns == "" {
		t.Fatalf("three brokers and a namespace expected: %v %v %q", services, webs, ns)
	}

	// Every broker answers every topic's owner, and a client of any one broker produces and
	// consumes (its lookups redirected to the owner when that is another broker).
	owners := map[string]bool{}
	redirected := 0
	for i := 0; i < 9; i++ {
		topic := fmt.Sprintf("persistent://%s/go-t-%d", ns, i)
		produceAndConsume(t, services[i%3], topic, 10)
		answer := ownerAt(t, webs[0], topic)
		for _, web := range webs[1:] {
			if other := ownerAt(t, web, topic); other != answer {
				t.Fatalf("%s: %s answers %s, %s answers %s", topic, webs[0], answer, web, other)
			}
		}
		owners[answer] = true
		if answer != services[i%3] {
			redirected++
		}
	}
	if redirected == 0 {
		t.Fatalf("every topic was owned by the broker its client was given: no redirect tried")
	}
	// An HTTP service URL: lookups over HTTP at a broker that may not own the topic.
	produceAndConsume(t, webs[2], fmt.Sprintf("persistent://%s/go-over-http", ns), 5)

	// A namespace unload through a broker that owns none of the topic's bundle, under load:
	// every send acknowledged, each stored once and in order (deduplication is on), on a new
	// owner the producer was sent to. Sends are synchronous: see unload_under_load_test.go.
	topic := fmt.Sprintf("persistent://%s/go-queue", ns)
	c := newClientURL(t, strings.Join(services, ","))
	// The checker's subscription first: without one (and without retention) a closed ledger
	// is trimmed at once, as Pulsar trims it.
	subscribe(t, c, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "check"}).Close()
	p, err := c.CreateProducer(pulsar.ProducerOptions{
		Topic: topic, DisableBatching: true, SendTimeout: 30 * time.Second, Name: "go-checker",
	})
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	defer p.Close()
	owner := ownerAt(t, webs[0], topic)
	var elsewhere string
	for i, s := range services {
		if s != owner {
			elsewhere = webs[i]
			break
		}
	}
	var mu sync.Mutex
	var acked []int
	var failed []error
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			_, err := p.Send(ctx, &pulsar.ProducerMessage{Payload: []byte(strconv.Itoa(i)), SequenceID: ptr(int64(i))})
			cancel()
			mu.Lock()
			if err != nil {
				failed = append(failed, err)
			} else {
				acked = append(acked, i)
			}
			mu.Unlock()
		}
	}()
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(acked) }
	waitFor := func(what string, ok func() bool) {
		deadline := time.Now().Add(30 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("not within 30 s: %s", what)
			}
			time.Sleep(10 * time.Millisecond) // polled: the sending goroutine's progress
		}
	}
	waitFor("50 sends acknowledged", func() bool { return count() >= 50 })
	if status, body := httpDo(t, http.MethodPut, elsewhere+"/admin/v2/namespaces/"+ns+"/unload"); status != 204 && status != 200 {
		t.Fatalf("unload through %s: %d %s", elsewhere, status, body)
	}
	after := count()
	waitFor("sends acknowledged after the unload", func() bool { return count() >= after+50 })
	close(stop)
	<-done
	if len(failed) > 0 {
		t.Fatalf("send errors reached the application: %v", failed)
	}
	if moved := ownerAt(t, webs[1], topic); moved == owner {
		t.Fatalf("the unloaded bundle stayed on %s", owner)
	}
	cons := subscribe(t, c, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "check"})
	for i, m := range receiveN(t, cons, len(acked)) {
		if string(m.Payload()) != strconv.Itoa(acked[i]) {
			t.Fatalf("message %d is %q, acknowledged %d", i, m.Payload(), acked[i])
		}
		ack(t, cons, m)
	}
	assertNothingMore(t, cons)
	t.Logf("three brokers: %d owners of 9 topics, %d reached by redirect; unload under load: %d sends acknowledged, consumed once each in order", len(owners), redirected, len(acked))
}

func ptr[T any](v T) *T { return &v }
