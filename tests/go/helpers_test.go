// Package compat drives a Pulsar-protocol broker with the official Go client
// (github.com/apache/pulsar-client-go). The tests encode Apache Pulsar's
// behaviour, so they must pass against Magnetar and against real Pulsar alike.
//
// Environment:
//
//	MAGNETAR_TEST_SERVICE_URL  pulsar://host:port of the broker (tests skip without it)
//	MAGNETAR_TEST_WEB_URL      http://host:port of its admin API
//	MAGNETAR_EXPECT_DELAYED=1  also assert that ReconsumeLater delays the redelivery
package compat

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	plog "github.com/apache/pulsar-client-go/pulsar/log"
	"github.com/sirupsen/logrus"
)

const (
	// receiveTimeout bounds the wait for one expected message.
	receiveTimeout = 10 * time.Second
	// quietPeriod is how long we listen for a message that must not arrive.
	quietPeriod = 700 * time.Millisecond
)

func serviceURL(t *testing.T) string {
	t.Helper()
	url := os.Getenv("MAGNETAR_TEST_SERVICE_URL")
	if url == "" {
		t.Skip("MAGNETAR_TEST_SERVICE_URL is not set (run through tests/compat/test_go_client.py)")
	}
	return url
}

func webURL(t *testing.T) string {
	t.Helper()
	url := os.Getenv("MAGNETAR_TEST_WEB_URL")
	if url == "" {
		t.Skip("MAGNETAR_TEST_WEB_URL is not set")
	}
	return strings.TrimRight(url, "/")
}

// newClient returns a client whose log only shows warnings and errors; it is
// closed when the test ends.
func newClient(t *testing.T) pulsar.Client {
	t.Helper()
	logger := logrus.New()
	logger.SetLevel(logrus.WarnLevel)
	c, err := pulsar.NewClient(pulsar.ClientOptions{
		URL:               serviceURL(t),
		ConnectionTimeout: 5 * time.Second,
		OperationTimeout:  15 * time.Second,
		Logger:            plog.NewLoggerWithLogrus(logger),
	})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

func uniqueTopic(prefix string) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "persistent://public/default/go-" + prefix + "-" + hex.EncodeToString(b)
}

func newProducer(t *testing.T, c pulsar.Client, opts pulsar.ProducerOptions) pulsar.Producer {
	t.Helper()
	p, err := c.CreateProducer(opts)
	if err != nil {
		t.Fatalf("producer on %s: %v", opts.Topic, err)
	}
	t.Cleanup(p.Close)
	return p
}

// subscribe always starts a new subscription at the earliest message, so a test
// may subscribe after producing.
func subscribe(t *testing.T, c pulsar.Client, opts pulsar.ConsumerOptions) pulsar.Consumer {
	t.Helper()
	opts.SubscriptionInitialPosition = pulsar.SubscriptionPositionEarliest
	cons, err := c.Subscribe(opts)
	if err != nil {
		t.Fatalf("subscribe %s on %s%v: %v", opts.SubscriptionName, opts.Topic, opts.Topics, err)
	}
	t.Cleanup(cons.Close)
	return cons
}

func send(t *testing.T, p pulsar.Producer, msg *pulsar.ProducerMessage) pulsar.MessageID {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id, err := p.Send(ctx, msg)
	if err != nil {
		t.Fatalf("send: %v", err)
	}
	return id
}

func receive(t *testing.T, cons pulsar.Consumer, timeout time.Duration) pulsar.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	m, err := cons.Receive(ctx)
	if err != nil {
		t.Fatalf("receive within %v: %v", timeout, err)
	}
	return m
}

func receiveN(t *testing.T, cons pulsar.Consumer, n int) []pulsar.Message {
	t.Helper()
	got := make([]pulsar.Message, 0, n)
	for len(got) < n {
		ctx, cancel := context.WithTimeout(context.Background(), receiveTimeout)
		m, err := cons.Receive(ctx)
		cancel()
		if err != nil {
			t.Fatalf("received only %d of %d messages: %v", len(got), n, err)
		}
		got = append(got, m)
	}
	return got
}

// assertNothingMore fails if a message arrives within quietPeriod.
func assertNothingMore(t *testing.T, cons pulsar.Consumer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), quietPeriod)
	defer cancel()
	m, err := cons.Receive(ctx)
	if err == nil {
		t.Fatalf("unexpected extra message %q (id %v, topic %s)", truncate(m.Payload()), m.ID(), m.Topic())
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("receive failed while waiting for silence: %v", err)
	}
}

func readNext(t *testing.T, r pulsar.Reader) pulsar.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), receiveTimeout)
	defer cancel()
	m, err := r.Next(ctx)
	if err != nil {
		t.Fatalf("reader next: %v", err)
	}
	return m
}

func ack(t *testing.T, cons pulsar.Consumer, m pulsar.Message) {
	t.Helper()
	if err := cons.Ack(m); err != nil {
		t.Fatalf("ack %v: %v", m.ID(), err)
	}
}

func sameEntry(a, b pulsar.MessageID) bool {
	return a.LedgerID() == b.LedgerID() && a.EntryID() == b.EntryID() && a.BatchIdx() == b.BatchIdx()
}

func truncate(b []byte) string {
	if len(b) > 40 {
		return string(b[:40]) + "..."
	}
	return string(b)
}

func randomPayload(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatalf("random: %v", err)
	}
	return b
}

// sendTally sends numbered messages (the payload is the number) asynchronously and counts
// their outcomes, for tests that keep many sends in flight while the broker closes producers.
type sendTally struct {
	mu       sync.Mutex
	answered int
	failed   map[int]error
}

func (s *sendTally) send(p pulsar.Producer, i int) {
	p.SendAsync(context.Background(), &pulsar.ProducerMessage{Payload: []byte(strconv.Itoa(i))},
		func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.answered++
			if err != nil {
				if s.failed == nil {
					s.failed = map[int]error{}
				}
				s.failed[i] = err
			}
		})
}

// requireAllAcknowledged fails the test unless each of the n sends was answered without error
// (call it after the producer's Flush).
func (s *sendTally) requireAllAcknowledged(t *testing.T, n int) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.answered != n || len(s.failed) > 0 {
		t.Fatalf("%d of %d sends answered, %d failed: %v", s.answered, n, len(s.failed), s.failed)
	}
}
