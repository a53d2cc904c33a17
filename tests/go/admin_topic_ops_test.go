package compat

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsaradmin/pkg/admin"
	"github.com/apache/pulsar-client-go/pulsaradmin/pkg/admin/config"
	"github.com/apache/pulsar-client-go/pulsaradmin/pkg/utils"
)

// Topic operations through the Go admin client (pulsaradmin), as operators' Go tooling
// drives them: stats, internal stats, subscriptions (create, list, skip, clear backlog,
// delete) and unload, over data produced by the Go client.

func newTopicAdmin(t *testing.T) admin.Client {
	t.Helper()
	a, err := admin.New(&config.Config{WebServiceURL: webURL(t)})
	if err != nil {
		t.Fatalf("admin client: %v", err)
	}
	return a
}

func topicName(t *testing.T, topic string) utils.TopicName {
	t.Helper()
	name, err := utils.GetTopicName(topic)
	if err != nil {
		t.Fatalf("topic name %s: %v", topic, err)
	}
	return *name
}

func backlog(t *testing.T, a admin.Client, topic utils.TopicName, sub string) int64 {
	t.Helper()
	stats, err := a.Topics().GetStats(topic)
	if err != nil {
		t.Fatalf("stats of %s: %v", topic.String(), err)
	}
	s, ok := stats.Subscriptions[sub]
	if !ok {
		t.Fatalf("stats of %s has no subscription %s: %+v", topic.String(), sub, stats.Subscriptions)
	}
	return s.MsgBacklog
}

func TestAdminTopicStatsSubscriptionsAndUnload(t *testing.T) {
	const n = 8
	topic := uniqueTopic("admin-ops")
	name := topicName(t, topic)
	a := newTopicAdmin(t)
	c := newClient(t)

	p := newProducer(t, c, pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
	if err := a.Subscriptions().Create(name, "sub", utils.Earliest); err != nil {
		t.Fatalf("create subscription: %v", err)
	}
	for i := 0; i < n; i++ {
		send(t, p, &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("m-%d", i))})
	}

	stats, err := a.Topics().GetStats(name)
	if err != nil {
		t.Fatalf("stats: %v", err)
	}
	if stats.MsgCounterIn != n || stats.StorageSize <= 0 {
		t.Fatalf("stats: msgInCounter %d (want %d), storageSize %d", stats.MsgCounterIn, n, stats.StorageSize)
	}
	if len(stats.Publishers) != 1 || stats.Publishers[0].ProducerName == "" {
		t.Fatalf("stats publishers: %+v", stats.Publishers)
	}
	if got := stats.Subscriptions["sub"].MsgBacklog; got != n {
		t.Fatalf("backlog %d, want %d", got, n)
	}

	internal, err := a.Topics().GetInternalStats(name)
	if err != nil {
		t.Fatalf("internal stats: %v", err)
	}
	if internal.NumberOfEntries != n || internal.EntriesAddedCounter != n {
		t.Fatalf("internal stats: entries %d, added %d, want %d", internal.NumberOfEntries,
			internal.EntriesAddedCounter, n)
	}
	if _, ok := internal.Cursors["sub"]; !ok {
		t.Fatalf("internal stats has no cursor sub: %+v", internal.Cursors)
	}

	subs, err := a.Subscriptions().List(name)
	if err != nil || len(subs) != 1 || subs[0] != "sub" {
		t.Fatalf("subscriptions: %v %v", subs, err)
	}

	msgs, err := a.Subscriptions().PeekMessages(name, "sub", 2)
	if err != nil || len(msgs) != 2 || string(msgs[0].Payload) != "m-0" || string(msgs[1].Payload) != "m-1" {
		t.Fatalf("peek: %v %v", msgs, err)
	}

	if err := a.Subscriptions().SkipMessages(name, "sub", 3); err != nil {
		t.Fatalf("skip: %v", err)
	}
	if got := backlog(t, a, name, "sub"); got != n-3 {
		t.Fatalf("backlog after skip 3: %d, want %d", got, n-3)
	}
	if err := a.Subscriptions().ClearBacklog(name, "sub"); err != nil {
		t.Fatalf("clear backlog: %v", err)
	}
	if got := backlog(t, a, name, "sub"); got != 0 {
		t.Fatalf("backlog after clear: %d, want 0", got)
	}

	// Unload: the producer and a consumer reconnect and carry on.
	cons := subscribe(t, c, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "live"})
	if err := a.Topics().Unload(name); err != nil {
		t.Fatalf("unload: %v", err)
	}
	send(t, p, &pulsar.ProducerMessage{Payload: []byte("after-unload")})
	ctx := ctxTimeout(t, 20*time.Second)
	for {
		m, err := cons.Receive(ctx)
		if err != nil {
			t.Fatalf("receive after unload: %v", err)
		}
		_ = cons.Ack(m)
		if string(m.Payload()) == "after-unload" {
			break
		}
	}
	if got := backlog(t, a, name, "sub"); got != 1 {
		t.Fatalf("backlog of sub after one more message: %d, want 1", got)
	}

	if err := a.Subscriptions().Delete(name, "sub"); err != nil {
		t.Fatalf("delete subscription: %v", err)
	}
	subs, err = a.Subscriptions().List(name)
	if err != nil || len(subs) != 1 || subs[0] != "live" {
		t.Fatalf("subscriptions after delete: %v %v", subs, err)
	}
}

// The subscription's msgAckRate counts what the Go client acknowledges by batch index (an
// ack_set without batch_size, which the Python client never sends); it was never measured (0)
// before 2026-11-27. The consumer's own msgAckRate and lastAckedTimestamp count them too (0
// until the fourth session of that day).
func TestAdminStatsCountBatchIndexAcks(t *testing.T) {
	topic := uniqueTopic("ack-rate")
	name := topicName(t, topic)
	a := newTopicAdmin(t)
	c := newClient(t)
	cons := subscribeBatchIndexAck(t, c, topic, pulsar.Shared)
	publishOneBatch(t, c, topic)
	msgs := receiveN(t, cons, batchSize)

	subStats := func() utils.SubscriptionStats {
		t.Helper()
		stats, err := a.Topics().GetStats(name)
		if err != nil {
			t.Fatalf("stats: %v", err)
		}
		return stats.Subscriptions["batch-index-ack"]
	}
	subStats() // the rate is measured from this reading on
	for _, m := range msgs[:4] {
		if err := cons.Ack(m); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		time.Sleep(1100 * time.Millisecond) // rates cover at least a second; no event to await
		s := subStats()
		consumerAcked := len(s.Consumers) == 1 && s.Consumers[0].MessageAckRate > 0 &&
			s.Consumers[0].LastAckedTimestamp > 0
		if s.MessageAckRate > 0 && consumerAcked {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("msgAckRate (subscription or consumer) still 0 after 4 batch-index acks: %+v", s)
		}
	}
}

// Stats as the Go admin client reads them: each producer's and consumer's metadata (the
// properties the client gave it), per-partition stats with the partition count and the last
// publish time, excludePublishers / excludeConsumers; a topic's properties set at its
// creation (partitioned or not); a message id found by publish time (GetMessageID).
func TestAdminStatsMetadataPropertiesAndMessageIDByTime(t *testing.T) {
	a := newTopicAdmin(t)
	c := newClient(t)

	plain := topicName(t, uniqueTopic("admin-props"))
	if err := a.Topics().CreateWithProperties(plain, 0, map[string]string{"k": "v"}); err != nil {
		t.Fatalf("create with properties: %v", err)
	}
	if got, err := a.Topics().GetProperties(plain); err != nil || got["k"] != "v" || len(got) != 1 {
		t.Fatalf("properties of a non-partitioned topic: %v, %v", got, err)
	}

	topic := uniqueTopic("admin-stats-meta")
	name := topicName(t, topic)
	if err := a.Topics().CreateWithProperties(name, 4, map[string]string{"owner": "tests"}); err != nil {
		t.Fatalf("create partitioned with properties: %v", err)
	}
	if got, err := a.Topics().GetProperties(name); err != nil || got["owner"] != "tests" {
		t.Fatalf("properties of a partitioned topic: %v, %v", got, err)
	}
	cons := subscribe(t, c, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s",
		Properties: map[string]string{"consumer-key": "consumer-value"}})
	p := newProducer(t, c, pulsar.ProducerOptions{Topic: topic, DisableBatching: true,
		Properties: map[string]string{"producer-key": "producer-value"}})
	for i := 0; i < 10; i++ {
		send(t, p, &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("m-%d", i)), Key: "pulsar"})
	}

	stats, err := a.Topics().GetPartitionedStatsWithOption(name, true, utils.GetStatsOptions{})
	if err != nil {
		t.Fatalf("partitioned stats: %v", err)
	}
	if len(stats.Partitions) != 4 || stats.Metadata.Partitions != 4 {
		t.Fatalf("partitioned stats list %d partitions (metadata %d), want 4",
			len(stats.Partitions), stats.Metadata.Partitions)
	}
	if stats.LastPublishTimestamp < time.Now().Add(-time.Minute).UnixMilli() {
		t.Fatalf("lastPublishTimeStamp %d, want the last send's time", stats.LastPublishTimestamp)
	}
	var producerMeta, consumerMeta bool
	for _, part := range stats.Partitions {
		for _, pub := range part.Publishers {
			producerMeta = producerMeta || pub.Metadata["producer-key"] == "producer-value"
		}
		for _, sub := range part.Subscriptions {
			for _, cs := range sub.Consumers {
				consumerMeta = consumerMeta || cs.Metadata["consumer-key"] == "consumer-value"
			}
		}
	}
	if !producerMeta || !consumerMeta {
		t.Fatalf("stats lack the client's properties: producer %v, consumer %v", producerMeta, consumerMeta)
	}
	bare, err := a.Topics().GetPartitionedStatsWithOption(name, true, utils.GetStatsOptions{
		ExcludePublishers: true, ExcludeConsumers: true})
	if err != nil {
		t.Fatalf("partitioned stats without publishers and consumers: %v", err)
	}
	for partition, part := range bare.Partitions {
		if len(part.Publishers) != 0 {
			t.Fatalf("%s lists publishers with excludePublishers", partition)
		}
		for _, sub := range part.Subscriptions {
			if len(sub.Consumers) != 0 {
				t.Fatalf("%s lists consumers with excludeConsumers", partition)
			}
		}
	}

	// GetMessageID: the first message published at or after a time, on one partition.
	m := receive(t, cons, receiveTimeout)
	ack(t, cons, m)
	partition := topicName(t, m.Topic())
	id, err := a.Topics().GetMessageID(partition, m.PublishTime().UnixMilli()-1000)
	if err != nil {
		t.Fatalf("message id by time: %v", err)
	}
	if id.LedgerID != m.ID().LedgerID() || id.EntryID != m.ID().EntryID() || id.PartitionIndex != int(m.ID().PartitionIdx()) {
		t.Fatalf("message id by time %+v, want the partition's first message %v", id, m.ID())
	}
	if _, err := a.Topics().GetMessageID(partition, time.Now().Add(time.Hour).UnixMilli()); err == nil ||
		!strings.Contains(err.Error(), "Message ID not found") {
		t.Fatalf("message id after every message: %v, want 404 Message ID not found", err)
	}
	if _, err := a.Topics().GetMessageID(name, 0); err == nil || !strings.Contains(err.Error(), "partitioned topic") {
		t.Fatalf("message id on a partitioned topic: %v, want 405", err)
	}
}

// Topic-level policies the Go admin client sets and reads back: maxSubscriptionsPerTopic,
// deduplicationSnapshotInterval, replicatorDispatchRate, offloadPolicies,
// autoSubscriptionCreation, replication clusters and delayedDelivery; removed, each reads as
// unset again. (tests/compat/test_topic_policies_enforced.py checks what Magnetar enforces.)
func TestAdminTopicLevelPoliciesRoundTrip(t *testing.T) {
	a := newTopicAdmin(t)
	name := topicName(t, uniqueTopic("admin-topic-policies"))
	if err := a.Topics().Create(name, 0); err != nil {
		t.Fatalf("create: %v", err)
	}
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	must("set maxSubscriptionsPerTopic", a.Topics().SetMaxSubscriptionsPerTopic(name, 7))
	if n, err := a.Topics().GetMaxSubscriptionsPerTopic(name); err != nil || n != 7 {
		t.Fatalf("maxSubscriptionsPerTopic %d, %v; want 7", n, err)
	}
	must("remove maxSubscriptionsPerTopic", a.Topics().RemoveMaxSubscriptionsPerTopic(name))
	if n, err := a.Topics().GetMaxSubscriptionsPerTopic(name); err != nil || n != -1 {
		t.Fatalf("maxSubscriptionsPerTopic after remove %d, %v; want unset (-1)", n, err)
	}

	must("set deduplicationSnapshotInterval", a.Topics().SetDeduplicationSnapshotInterval(name, 120))
	if n, err := a.Topics().GetDeduplicationSnapshotInterval(name); err != nil || n != 120 {
		t.Fatalf("deduplicationSnapshotInterval %d, %v; want 120", n, err)
	}

	rate := utils.DispatchRateData{DispatchThrottlingRateInMsg: 100, DispatchThrottlingRateInByte: 2048,
		RatePeriodInSecond: 1}
	must("set replicatorDispatchRate", a.Topics().SetReplicatorDispatchRate(name, rate))
	if got, err := a.Topics().GetReplicatorDispatchRate(name); err != nil || got == nil || *got != rate {
		t.Fatalf("replicatorDispatchRate %+v, %v; want %+v", got, err, rate)
	}

	offload := utils.OffloadPolicies{ManagedLedgerOffloadDriver: "aws-s3",
		ManagedLedgerOffloadThresholdInBytes: 1 << 20}
	must("set offloadPolicies", a.Topics().SetOffloadPolicies(name, offload))
	if got, err := a.Topics().GetOffloadPolicies(name); err != nil || got == nil ||
		got.ManagedLedgerOffloadDriver != "aws-s3" || got.ManagedLedgerOffloadThresholdInBytes != 1<<20 {
		t.Fatalf("offloadPolicies %+v, %v", got, err)
	}

	must("set autoSubscriptionCreation", a.Topics().SetAutoSubscriptionCreation(name,
		utils.AutoSubscriptionCreationOverride{AllowAutoSubscriptionCreation: false}))
	if got, err := a.Topics().GetAutoSubscriptionCreation(name); err != nil || got == nil ||
		got.AllowAutoSubscriptionCreation {
		t.Fatalf("autoSubscriptionCreation %+v, %v; want false", got, err)
	}
	must("remove autoSubscriptionCreation", a.Topics().RemoveAutoSubscriptionCreation(name))

	must("set replication clusters", a.Topics().SetReplicationClusters(name, []string{"standalone"}))
	if got, err := a.Topics().GetReplicationClusters(name); err != nil || len(got) != 1 || got[0] != "standalone" {
		t.Fatalf("replication clusters %v, %v", got, err)
	}

	must("set delayedDelivery", a.Topics().SetDelayedDelivery(name, utils.DelayedDeliveryData{
		Active: false, TickTime: 500}))
	if got, err := a.Topics().GetDelayedDelivery(name); err != nil || got == nil || got.Active || got.TickTime != 500 {
		t.Fatalf("delayedDelivery %+v, %v; want inactive, tick 500", got, err)
	}
	must("remove delayedDelivery", a.Topics().RemoveDelayedDelivery(name))
}
