package magnetar.compat;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.MessageRoutingMode;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.junit.jupiter.api.Test;

/** The admin REST topic create / delete as seen by the client, and the client's HTTP lookup
 * (a client built with the http:// web service URL). */
class AdminLookupTest extends PulsarTestBase {

    private static String topicPath(String topic) {
        return "/admin/v2/persistent/public/default/" + shortName(topic);
    }

    private static boolean listed(String topic) throws Exception {
        HttpResult r = http("GET", "/admin/v2/persistent/public/default", null);
        assertHttpOk(r, "list topics");
        return r.body().contains("\"" + topic + "\"");
    }

    /** PUT creates a non-partitioned topic: it is listed, and a second PUT is a conflict (409). */
    @Test
    void adminCreateTopicIsListedAndConflictsOnce() throws Exception {
        String topic = uniqueTopic("admin-create");
        assertFalse(listed(topic), "listed before creation");
        assertHttpOk(http("PUT", topicPath(topic), null), "create topic");
        assertTrue(listed(topic), "created topic not listed");
        assertEquals(409, http("PUT", topicPath(topic), null).status(), "second create of " + topic);
        // and the client can use it, as a non-partitioned topic
        PulsarClient c = client();
        assertEquals(List.of(topic), await(c.getPartitionsForTopic(topic), OP_TIMEOUT_S, "partitions"));
    }

    /** DELETE removes a topic with its messages and subscriptions: it is no longer listed, a
     * new subscription from the earliest message gets nothing, and a second DELETE is 404. */
    @Test
    void adminDeleteTopicRemovesItsMessages() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("admin-delete");
        try (Producer<byte[]> p = c.newProducer().topic(topic).enableBatching(false).create()) {
            p.send(bytes("old-1"));
            p.send(bytes("old-2"));
        }
        assertTrue(listed(topic), "topic with messages not listed");
        assertHttpOk(http("DELETE", topicPath(topic), null), "delete topic");
        assertFalse(listed(topic), "deleted topic still listed");
        assertEquals(404, http("DELETE", topicPath(topic), null).status(), "second delete of " + topic);

        Consumer<byte[]> cons = closeLater(c.newConsumer().topic(topic).subscriptionName("s")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe());
        assertNothingMore(cons);
        try (Producer<byte[]> p = c.newProducer().topic(topic).enableBatching(false).create()) {
            p.send(bytes("new"));
        }
        assertEquals("new", text(receive(cons)));
    }

    /** A client whose service URL is the web service (http://) looks topics up over HTTP
     * (/lookup/v2/topic/...), learns the partitions over HTTP, then talks to the binary port. */
    @Test
    void httpLookupServiceUrlProduceConsume() throws Exception {
        PulsarClient c = client(webUrl());
        String topic = uniqueTopic("http-lookup");
        Consumer<byte[]> cons = closeLater(c.newConsumer().topic(topic).subscriptionName("s")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe());
        Producer<byte[]> p = closeLater(c.newProducer().topic(topic).enableBatching(false).create());
        p.send(bytes("over-http-lookup"));
        assertEquals("over-http-lookup", text(receive(cons)));
    }

    @Test
    void httpLookupPartitionedTopic() throws Exception {
        String topic = uniqueTopic("http-lookup-parted");
        createPartitionedTopic(topic, 2);
        PulsarClient c = client(webUrl());
        assertEquals(2, await(c.getPartitionsForTopic(topic), OP_TIMEOUT_S, "partitions over HTTP").size());
        Consumer<byte[]> cons = closeLater(c.newConsumer().topic(topic).subscriptionName("s")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe());
        Producer<byte[]> p = closeLater(c.newProducer().topic(topic).enableBatching(false)
                .messageRoutingMode(MessageRoutingMode.RoundRobinPartition).create());
        for (int i = 0; i < 4; i++) {
            p.send(bytes("m" + i));
        }
        for (Message<byte[]> m : receiveN(cons, 4)) {
            assertTrue(m.getTopicName().startsWith(topic + "-partition-"), m.getTopicName());
        }
    }
}
