package magnetar.compat;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.client.api.SubscriptionType;
import org.junit.jupiter.api.Test;

/** deliverAfter / deliverAt on a Shared subscription. */
class DelayedDeliveryTest extends PulsarTestBase {

    /** A message sent with deliverAfter(3 s) is held back: a message sent right after it
     * without delay arrives first, and the delayed one not before its time (less Pulsar's
     * 1 s tick tolerance) and not much later. */
    @Test
    void deliverAfterHoldsMessageBack() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("delayed");
        Consumer<String> cons = closeLater(c.newConsumer(org.apache.pulsar.client.api.Schema.STRING)
                .topic(topic).subscriptionName("s")
                .subscriptionType(SubscriptionType.Shared)
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe());
        Producer<String> p = closeLater(c.newProducer(org.apache.pulsar.client.api.Schema.STRING)
                .topic(topic).enableBatching(false).create());
        long t0 = System.nanoTime();
        p.newMessage().value("later").deliverAfter(3, TimeUnit.SECONDS).send();
        p.newMessage().value("now").send();

        Message<String> first = receive(cons);
        assertEquals("now", first.getValue(), "the undelayed message must arrive first");
        cons.acknowledge(first);
        Message<String> later = receive(cons, RECEIVE_TIMEOUT_S + 3);
        long ms = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0);
        assertEquals("later", later.getValue());
        assertTrue(ms >= 2000, "delayed message arrived after " + ms + " ms, asked for 3000");
        assertTrue(ms <= 10_000, "delayed message arrived only after " + ms + " ms, asked for 3000");
        cons.acknowledge(later);
        assertNothingMore(cons);
    }

    /** deliverAt in the past delivers at once. */
    @Test
    void deliverAtInThePastDeliversAtOnce() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("delayed-past");
        Consumer<String> cons = closeLater(c.newConsumer(org.apache.pulsar.client.api.Schema.STRING)
                .topic(topic).subscriptionName("s")
                .subscriptionType(SubscriptionType.Shared)
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe());
        Producer<String> p = closeLater(c.newProducer(org.apache.pulsar.client.api.Schema.STRING)
                .topic(topic).enableBatching(false).create());
        p.newMessage().value("past").deliverAt(System.currentTimeMillis() - 60_000).send();
        long t0 = System.nanoTime();
        Message<String> m = receive(cons);
        assertEquals("past", m.getValue());
        long ms = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0);
        assertTrue(ms < 2000, "a message due a minute ago took " + ms + " ms");
    }
}
