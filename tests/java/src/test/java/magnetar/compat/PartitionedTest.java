package magnetar.compat;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.regex.Pattern;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.MessageRoutingMode;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.RegexSubscriptionMode;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** Partitioned topics (created through the admin REST API) and pattern consumers. */
class PartitionedTest extends PulsarTestBase {

    /** The client sees the partitions; round-robin spreads messages over all of them; keyed
     * messages stick to one partition; a consumer on the partitioned topic gets everything. */
    @Test
    void partitionedProduceConsume() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("parted");
        createPartitionedTopic(topic, 3);
        List<String> partitions = await(c.getPartitionsForTopic(topic), OP_TIMEOUT_S, "partitions");
        assertEquals(List.of(topic + "-partition-0", topic + "-partition-1", topic + "-partition-2"), partitions);

        Consumer<byte[]> cons = closeLater(c.newConsumer().topic(topic).subscriptionName("s")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe());
        Producer<byte[]> p = closeLater(c.newProducer().topic(topic).enableBatching(false)
                .messageRoutingMode(MessageRoutingMode.RoundRobinPartition).create());
        int n = 30;
        for (int i = 0; i < n; i++) {
            p.send(bytes("rr" + i));
        }
        for (int i = 0; i < 10; i++) {
            p.newMessage().key("sticky").value(bytes("key" + i)).send();
        }
        Set<String> seen = new HashSet<>();
        Map<String, Integer> perPartition = new HashMap<>();
        Set<String> keyPartitions = new HashSet<>();
        for (Message<byte[]> m : receiveN(cons, n + 10)) {
            assertTrue(seen.add(text(m)), "twice: " + text(m));
            assertTrue(partitions.contains(m.getTopicName()), "message from " + m.getTopicName());
            if (text(m).startsWith("rr")) {
                perPartition.merge(m.getTopicName(), 1, Integer::sum);
            } else {
                keyPartitions.add(m.getTopicName());
            }
            cons.acknowledge(m);
        }
        assertEquals(3, perPartition.size(), "round robin did not use every partition: " + perPartition);
        assertEquals(1, keyPartitions.size(), "one key went to several partitions: " + keyPartitions);
        assertNothingMore(cons);
    }

    /** A pattern consumer subscribes to the matching topics that exist, and to a matching
     * topic created later (auto-discovery); it ignores topics that do not match. */
    @Test
    @Timeout(60)
    void patternConsumerDiscoversTopics() throws Exception {
        PulsarClient c = client();
        String base = uniqueTopic("pat");
        String t1 = base + "-one";
        String t2 = base + "-two";
        String other = uniqueTopic("nopat");
        for (String t : List.of(t1, t2, other)) {
            try (Producer<byte[]> p = c.newProducer().topic(t).enableBatching(false).create()) {
                p.send(bytes("hello " + shortName(t)));
            }
        }
        Consumer<byte[]> cons = closeLater(c.newConsumer()
                .topicsPattern(Pattern.compile(base + "-.*")) // base: [a-z0-9:/-] only, no quoting needed
                .subscriptionTopicsMode(RegexSubscriptionMode.PersistentOnly)
                .patternAutoDiscoveryPeriod(1, TimeUnit.SECONDS)
                .subscriptionName("s")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe());
        Set<String> got = new HashSet<>();
        for (Message<byte[]> m : receiveN(cons, 2)) {
            got.add(text(m));
            cons.acknowledge(m);
        }
        assertEquals(Set.of("hello " + shortName(t1), "hello " + shortName(t2)), got);
        assertNothingMore(cons);

        // a new matching topic: discovered within a few discovery periods
        String t3 = base + "-three";
        try (Producer<byte[]> p = c.newProducer().topic(t3).enableBatching(false).create()) {
            p.send(bytes("hello " + shortName(t3)));
        }
        Message<byte[]> m = receive(cons, 30);
        assertEquals("hello " + shortName(t3), text(m));
        assertEquals(t3, m.getTopicName());
    }

    /** Partitions of a partitioned topic created over REST can be consumed one by one. */
    @Test
    void singlePartitionConsumer() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("parted-one");
        createPartitionedTopic(topic, 2);
        Producer<byte[]> p = closeLater(c.newProducer().topic(topic).enableBatching(false)
                .messageRoutingMode(MessageRoutingMode.RoundRobinPartition).create());
        for (int i = 0; i < 10; i++) {
            p.send(bytes("m" + i));
        }
        // round robin without batching alternates the partitions: 5 messages on each
        Set<String> all = new HashSet<>();
        for (int part = 0; part < 2; part++) {
            Consumer<byte[]> cons = closeLater(c.newConsumer().topic(topic + "-partition-" + part)
                    .subscriptionName("s")
                    .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe());
            for (Message<byte[]> m : receiveN(cons, 5)) {
                assertEquals(topic + "-partition-" + part, m.getTopicName());
                all.add(text(m));
            }
            assertNothingMore(cons);
        }
        assertEquals(10, all.size());
    }
}
