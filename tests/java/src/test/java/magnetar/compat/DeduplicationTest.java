package magnetar.compat;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;

import java.util.UUID;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.MessageId;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.Schema;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.junit.jupiter.api.Test;

/** Producer deduplication (a namespace with deduplication enabled through the admin REST API). */
class DeduplicationTest extends PulsarTestBase {

    /** A fresh namespace with deduplication on; returns tenant/namespace. */
    private static String dedupNamespace() throws Exception {
        String ns = "public/java-dedup-" + UUID.randomUUID().toString().substring(0, 12);
        assertHttpOk(http("PUT", "/admin/v2/namespaces/" + ns, null), "create namespace " + ns);
        assertHttpOk(http("POST", "/admin/v2/namespaces/" + ns + "/deduplication", "true"),
                "enable deduplication on " + ns);
        HttpResult r = http("GET", "/admin/v2/namespaces/" + ns + "/deduplication", null);
        assertEquals("true", r.body().trim(), "deduplication policy of " + ns);
        return ns;
    }

    private Producer<String> producer(PulsarClient c, String topic, String name) throws Exception {
        return c.newProducer(Schema.STRING).topic(topic).producerName(name).enableBatching(false).create();
    }

    private static boolean isDupReceipt(MessageId id) {
        return adv(id).getLedgerId() == -1 && adv(id).getEntryId() == -1;
    }

    /** A producer that comes back under the same name learns its last stored sequence id;
     * resent sequence ids are acknowledged but not stored; new ones are. */
    @Test
    void resentSequenceIdsAreNotStored() throws Exception {
        PulsarClient c = client();
        String topic = "persistent://" + dedupNamespace() + "/resend";
        Consumer<String> cons = closeLater(c.newConsumer(Schema.STRING).topic(topic).subscriptionName("s")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe());
        try (Producer<String> p = producer(c, topic, "p1")) {
            assertEquals(-1, p.getLastSequenceId());
            for (long seq = 10; seq < 15; seq++) {
                MessageId id = p.newMessage().sequenceId(seq).value("m" + seq).send();
                assertNotEquals(true, isDupReceipt(id), "first send of " + seq + " treated as a duplicate");
            }
        }
        try (Producer<String> p = producer(c, topic, "p1")) {
            assertEquals(14, p.getLastSequenceId(), "last sequence id told to a returning producer");
            for (long seq = 10; seq < 15; seq++) {
                MessageId id = p.newMessage().sequenceId(seq).value("again" + seq).send();
                assertEquals(true, isDupReceipt(id), "resent " + seq + ": receipt " + id);
            }
            for (long seq = 15; seq < 18; seq++) {
                p.newMessage().sequenceId(seq).value("m" + seq).send();
            }
            assertEquals(17, p.getLastSequenceId());
        }
        for (long seq = 10; seq < 18; seq++) {
            assertEquals("m" + seq, receive(cons).getValue());
        }
        assertNothingMore(cons);

        // another producer name has a sequence of its own
        try (Producer<String> other = producer(c, topic, "p2")) {
            assertEquals(-1, other.getLastSequenceId());
            other.newMessage().sequenceId(1).value("p2-1").send();
        }
        assertEquals("p2-1", receive(cons).getValue());
    }

    /** Without deduplication (public/default) the same resends are stored. */
    @Test
    void withoutDeduplicationResendsAreStored() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("no-dedup");
        Consumer<String> cons = closeLater(c.newConsumer(Schema.STRING).topic(topic).subscriptionName("s")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe());
        try (Producer<String> p = producer(c, topic, "p")) {
            p.newMessage().sequenceId(1).value("a1").send();
            p.newMessage().sequenceId(2).value("a2").send();
        }
        try (Producer<String> p = producer(c, topic, "p")) {
            p.newMessage().sequenceId(1).value("b1").send();
        }
        for (String want : new String[] {"a1", "a2", "b1"}) {
            assertEquals(want, receive(cons).getValue());
        }
    }
}
