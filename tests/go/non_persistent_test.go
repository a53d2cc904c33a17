package compat

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/bits"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

// A non-persistent topic's Key_Shared subscription routes with the same selectors as a
// persistent one (Pulsar's non-persistent dispatcher does): STICKY consumers get exactly the
// hash ranges they asked for, whatever order they joined in, and an overlapping range is
// refused.
func TestNonPersistentKeySharedStickyRanges(t *testing.T) {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	topic := "non-persistent://public/default/go-np-ks-" + hex.EncodeToString(b)
	c := newClient(t)
	sticky := func(ranges ...int) *pulsar.KeySharedPolicy {
		policy, err := pulsar.NewKeySharedPolicySticky(ranges)
		if err != nil {
			t.Fatalf("policy: %v", err)
		}
		return policy
	}
	consumer := func(name string, policy *pulsar.KeySharedPolicy) (pulsar.Consumer, error) {
		return c.Subscribe(pulsar.ConsumerOptions{
			Topic: topic, SubscriptionName: "ks", Type: pulsar.KeyShared, Name: name,
			KeySharedPolicy: policy, ReceiverQueueSize: 1000,
		})
	}
	// The upper range joins first: an even split in join order would give it the lower half.
	high, err := consumer("high", sticky(32768, 65535))
	if err != nil {
		t.Fatalf("subscribe high: %v", err)
	}
	defer high.Close()
	low, err := consumer("low", sticky(0, 32767))
	if err != nil {
		t.Fatalf("subscribe low: %v", err)
	}
	defer low.Close()
	if overlap, err := consumer("overlap", sticky(100, 200)); err == nil {
		overlap.Close()
		t.Fatalf("a consumer whose range overlaps another's was let in")
	} else {
		t.Logf("overlap refused: %v", err)
	}
	if got := murmur3([]byte("hello")); got != 0x248bfa47 {
		t.Fatalf("murmur3 helper: %#x", got) // the published reference vector
	}

	p := newProducer(t, c, pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
	const n = 100
	for i := 0; i < n; i++ {
		key := fmt.Sprintf("key-%d", i)
		send(t, p, &pulsar.ProducerMessage{Key: key, Payload: []byte(key)})
	}
	got := 0
	for _, tc := range []struct {
		cons     pulsar.Consumer
		lo, hi   uint32
		received int
	}{{cons: low, lo: 0, hi: 32767}, {cons: high, lo: 32768, hi: 65535}} {
		for {
			m := receiveOrNil(tc.cons, 700*time.Millisecond)
			if m == nil {
				break
			}
			hash := stickyHash([]byte(m.Key()))
			if hash < tc.lo || hash > tc.hi {
				t.Fatalf("%s got key %s (hash %d), outside %d-%d", tc.cons.Name(), m.Key(), hash, tc.lo, tc.hi)
			}
			tc.received++
			got++
		}
		if tc.received == 0 {
			t.Fatalf("%s received nothing", tc.cons.Name())
		}
	}
	if got != n {
		t.Fatalf("received %d of %d messages", got, n)
	}
}

func receiveOrNil(cons pulsar.Consumer, wait time.Duration) pulsar.Message {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	m, err := cons.Receive(ctx)
	if err != nil {
		return nil
	}
	return m
}

// stickyHash is Pulsar 4's sticky key hash: Murmur3_32 (seed 0, sign bit cleared) mod 65536,
// 0 mapped to 1.
func stickyHash(key []byte) uint32 {
	hash := (murmur3(key) & 0x7fffffff) % 65536
	if hash == 0 {
		return 1
	}
	return hash
}

func murmur3(data []byte) uint32 {
	const c1, c2 = 0xcc9e2d51, 0x1b873593
	mix := func(k uint32) uint32 { return bits.RotateLeft32(k*c1, 15) * c2 }
	var h uint32
	n := len(data) / 4
	for i := 0; i < n; i++ {
		h ^= mix(binary.LittleEndian.Uint32(data[4*i:]))
		h = bits.RotateLeft32(h, 13)*5 + 0xe6546b64
	}
	var k uint32
	tail := data[4*n:]
	for i := len(tail) - 1; i >= 0; i-- {
		k = k<<8 | uint32(tail[i])
	}
	if len(tail) > 0 {
		h ^= mix(k)
	}
	h ^= uint32(len(data))
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}

// A non-persistent topic registers and checks schemas as a persistent one does (Pulsar keys
// its registry without the domain): the producer's schema gets version 0, the consumer decodes
// typed values with it, and an incompatible schema is refused.
func TestNonPersistentSchemas(t *testing.T) {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	topic := "non-persistent://public/default/go-np-schema-" + hex.EncodeToString(b)
	const user = `{"type":"record","name":"User","fields":[` +
		`{"name":"name","type":"string"},{"name":"age","type":"int"}]}`
	const ageAsString = `{"type":"record","name":"User","fields":[` +
		`{"name":"name","type":"string"},{"name":"age","type":"string"}]}`
	type User struct {
		Name string `avro:"name"`
		Age  int32  `avro:"age"`
	}
	c := newClient(t)
	cons := subscribe(t, c, pulsar.ConsumerOptions{
		Topic: topic, SubscriptionName: "s", Schema: pulsar.NewAvroSchema(user, nil),
	})
	// Batched: the Go client (v0.19) writes the schema version only into batch metadata.
	p := newProducer(t, c, pulsar.ProducerOptions{
		Topic: topic, Schema: pulsar.NewAvroSchema(user, nil),
	})
	send(t, p, &pulsar.ProducerMessage{Value: &User{Name: "go", Age: 3}})
	m := receive(t, cons, 10*time.Second)
	var got User
	if err := m.GetSchemaValue(&got); err != nil {
		t.Fatalf("decode: %v", err)
	}
	if got != (User{Name: "go", Age: 3}) {
		t.Fatalf("got %+v", got)
	}
	if v := m.SchemaVersion(); len(v) != 8 || binary.BigEndian.Uint64(v) != 0 {
		t.Fatalf("schema version %x, want version 0", v)
	}
	bad, err := c.CreateProducer(pulsar.ProducerOptions{
		Topic: topic, Schema: pulsar.NewAvroSchema(ageAsString, nil),
	})
	if err == nil {
		bad.Close()
		t.Fatalf("a producer with an incompatible schema was let in")
	}
	t.Logf("incompatible schema refused: %v", err)
}

// TestNonPersistentPublishRate: a topic publishRate policy, set while the producer is open,
// paces a non-persistent topic's producer as a persistent one's (Pulsar's NonPersistentTopic
// has the same publish rate limiter): every send succeeds, later, and the topic's stats count
// the pauses.
func TestNonPersistentPublishRate(t *testing.T) {
	const rate = 20
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	name := "go-np-publish-rate-" + hex.EncodeToString(b)
	topic := "non-persistent://public/default/" + name
	c := newClient(t)
	cons := subscribe(t, c, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s"})
	p := newProducer(t, c, pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
	send(t, p, &pulsar.ProducerMessage{Payload: []byte("before")})
	path := "/admin/v2/non-persistent/public/default/" + name
	adminOK(t, "POST", path+"/publishRate",
		fmt.Sprintf(`{"publishThrottlingRateInMsg":%d,"publishThrottlingRateInByte":-1}`, rate))
	started := time.Now()
	for i := 0; i < 3*rate; i++ {
		send(t, p, &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("m-%d", i))})
	}
	// A burst of `rate`, then `rate` a second: 2 s for the other 2 * rate.
	if elapsed := time.Since(started); elapsed < 1500*time.Millisecond {
		t.Fatalf("%d sends took %v: the publish rate did not hold", 3*rate, elapsed)
	}
	var stats struct {
		PublishRateLimitedTimes int64 `json:"publishRateLimitedTimes"`
	}
	if err := json.Unmarshal([]byte(adminOK(t, "GET", path+"/stats", "")), &stats); err != nil {
		t.Fatalf("stats: %v", err)
	}
	if stats.PublishRateLimitedTimes == 0 {
		t.Fatalf("publishRateLimitedTimes is 0 after paced sends")
	}
	got := receiveN(t, cons, 1+3*rate)
	for i, m := range got[1:] {
		if want := fmt.Sprintf("m-%d", i); string(m.Payload()) != want {
			t.Fatalf("message %d is %q, want %q", i, m.Payload(), want)
		}
	}
}

// TestNonPersistentLimits: a non-persistent topic's maxConsumers, maxProducers and
// maxMessageSize policies, set while clients are attached, hold for the Go client too: one
// consumer and one producer more are refused (ConsumerBusy, ProducerBusy), and a message over
// the size fails and is not delivered while the ones under it are (the broker answers
// SEND_ERROR NotAllowed; the Go client v0.19 reconnects and resends on it until its send
// timeout, 3 s here, as it does against Pulsar).
func TestNonPersistentLimits(t *testing.T) {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	name := "go-np-limits-" + hex.EncodeToString(b)
	topic := "non-persistent://public/default/" + name
	path := "/admin/v2/non-persistent/public/default/" + name
	c := newClient(t)
	cons := subscribe(t, c, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s"})
	p := newProducer(t, c, pulsar.ProducerOptions{
		Topic: topic, DisableBatching: true, SendTimeout: 3 * time.Second,
	})
	adminOK(t, "POST", path+"/maxConsumers", "1")
	adminOK(t, "POST", path+"/maxProducers", "1")
	adminOK(t, "POST", path+"/maxMessageSize", "10000")

	if extra, err := c.Subscribe(pulsar.ConsumerOptions{
		Topic: topic, SubscriptionName: "other",
	}); err == nil {
		extra.Close()
		t.Fatalf("a second consumer was let in past maxConsumers 1")
	} else {
		t.Logf("second consumer refused: %v", err)
	}
	if extra, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic}); err == nil {
		extra.Close()
		t.Fatalf("a second producer was let in past maxProducers 1")
	} else {
		t.Logf("second producer refused: %v", err)
	}

	send(t, p, &pulsar.ProducerMessage{Payload: []byte("small")})
	if got := receive(t, cons, 10*time.Second); string(got.Payload()) != "small" {
		t.Fatalf("got %q, want small", got.Payload())
	}
	_, err := p.Send(context.Background(), &pulsar.ProducerMessage{Payload: make([]byte, 20000)})
	if err == nil {
		t.Fatalf("a 20000-byte message was accepted over maxMessageSize 10000")
	}
	t.Logf("oversized message refused: %v", err)
	if m := receiveOrNil(cons, 500*time.Millisecond); m != nil {
		t.Fatalf("the refused message was delivered (%d bytes)", len(m.Payload()))
	}
}
