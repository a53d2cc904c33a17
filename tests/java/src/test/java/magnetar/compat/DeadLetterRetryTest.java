package magnetar.compat;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.DeadLetterPolicy;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.client.api.SubscriptionType;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** Dead-letter topics (after maxRedeliverCount) and retry topics (reconsumeLater). */
class DeadLetterRetryTest extends PulsarTestBase {

    /** A message negatively acked past maxRedeliverCount is published by the client to the
     * dead-letter topic (with its properties, REAL_TOPIC and ORIGIN_MESSAGE_ID) and acked on
     * the original topic; the other messages are unaffected. */
    @Test
    void negativeAckedPastMaxRedeliverGoesToDeadLetterTopic() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("dlq");
        String dlq = topic + "-my-DLQ";
        int maxRedeliver = 2;
        Consumer<byte[]> dlqCons = closeLater(c.newConsumer().topic(dlq).subscriptionName("dlq-sub")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe());
        Consumer<byte[]> cons = closeLater(c.newConsumer().topic(topic).subscriptionName("s")
                .subscriptionType(SubscriptionType.Shared)
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                .negativeAckRedeliveryDelay(100, TimeUnit.MILLISECONDS)
                .deadLetterPolicy(DeadLetterPolicy.builder().maxRedeliverCount(maxRedeliver)
                        .deadLetterTopic(dlq).build())
                .subscribe());
        Producer<byte[]> p = closeLater(c.newProducer().topic(topic).enableBatching(false).create());
        p.newMessage().value(bytes("poison")).property("app", "x").key("k1").send();
        p.send(bytes("fine"));

        int poisonDeliveries = 0;
        boolean fineSeen = false;
        // deliveries with redelivery count 0..maxRedeliver, then the client dead-letters it
        while (poisonDeliveries <= maxRedeliver || !fineSeen) {
            Message<byte[]> m = receive(cons);
            if (text(m).equals("fine")) {
                fineSeen = true;
                cons.acknowledge(m);
                continue;
            }
            assertEquals("poison", text(m));
            assertEquals(poisonDeliveries, m.getRedeliveryCount(), "redelivery count of delivery " + poisonDeliveries);
            poisonDeliveries++;
            cons.negativeAcknowledge(m);
        }
        Message<byte[]> dead = receive(dlqCons);
        assertEquals("poison", text(dead));
        assertEquals("x", dead.getProperty("app"));
        assertEquals("k1", dead.getKey());
        assertEquals(topic, dead.getProperty("REAL_TOPIC"));
        assertNotNull(dead.getProperty("ORIGIN_MESSAGE_ID"), "ORIGIN_MESSAGE_ID property");
        // dead-lettered = acknowledged on the original subscription: never delivered again
        assertNothingMore(cons);
        assertNothingMore(dlqCons);
    }

    /** enableRetry + reconsumeLater: the message goes to the retry topic with a delay, comes
     * back with RECONSUMETIMES raised, and after maxRedeliverCount reconsumes goes to the DLQ. */
    @Test
    @Timeout(45)
    void reconsumeLaterGoesThroughRetryTopicThenDeadLetter() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("retry");
        String retry = topic + "-s-RETRY";
        String dlq = topic + "-s-DLQ";
        int maxRedeliver = 2;
        Consumer<byte[]> dlqCons = closeLater(c.newConsumer().topic(dlq).subscriptionName("dlq-sub")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe());
        Consumer<byte[]> cons = closeLater(c.newConsumer().topic(topic).subscriptionName("s")
                .subscriptionType(SubscriptionType.Shared)
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                .enableRetry(true)
                .deadLetterPolicy(DeadLetterPolicy.builder().maxRedeliverCount(maxRedeliver)
                        .retryLetterTopic(retry).deadLetterTopic(dlq).build())
                .subscribe());
        Producer<byte[]> p = closeLater(c.newProducer().topic(topic).enableBatching(false).create());
        p.newMessage().value(bytes("retry-me")).property("app", "x").send();

        Message<byte[]> m = receive(cons);
        assertEquals("retry-me", text(m));
        assertEquals(topic, m.getTopicName());
        for (int attempt = 1; attempt <= maxRedeliver; attempt++) {
            cons.reconsumeLater(m, 1, TimeUnit.SECONDS);
            m = receive(cons, RECEIVE_TIMEOUT_S + 1);
            assertEquals("retry-me", text(m), "retry " + attempt);
            assertTrue(m.getTopicName().equals(retry) || m.getTopicName().endsWith(shortName(retry)),
                    "retry " + attempt + " came from " + m.getTopicName() + ", want " + retry);
            assertEquals(Integer.toString(attempt), m.getProperty("RECONSUMETIMES"), "RECONSUMETIMES");
            assertEquals("x", m.getProperty("app"));
            assertEquals(topic, m.getProperty("REAL_TOPIC"));
        }
        cons.reconsumeLater(m, 1, TimeUnit.SECONDS);
        Message<byte[]> dead = receive(dlqCons, RECEIVE_TIMEOUT_S + 2);
        assertEquals("retry-me", text(dead));
        assertEquals("x", dead.getProperty("app"));
        assertNothingMore(cons);
    }
}
