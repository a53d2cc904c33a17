package magnetar.compat;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.CompressionType;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.MessageId;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.Schema;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

/** Produce and consume: batching, every compression codec, keys, properties, event time. */
class ProduceConsumeTest extends PulsarTestBase {

    /** A batching producer with each codec: every message arrives once, in order, with its
     * key, properties and event time, and (batching) inside batches of more than one. */
    @ParameterizedTest(name = "batched {0}")
    @EnumSource(value = CompressionType.class, names = {"NONE", "LZ4", "ZLIB", "ZSTD", "SNAPPY"})
    void batchedWithCompression(CompressionType codec) throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("codec-" + codec.name().toLowerCase());
        Consumer<byte[]> cons = closeLater(c.newConsumer().topic(topic).subscriptionName("s")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe());
        Producer<byte[]> p = closeLater(c.newProducer().topic(topic)
                .compressionType(codec)
                .enableBatching(true).batchingMaxMessages(25)
                .batchingMaxPublishDelay(50, TimeUnit.MILLISECONDS)
                .create());
        int n = 100;
        // a compressible payload, so the codec really changes the bytes on the wire
        String filler = "abcdefgh".repeat(32);
        List<CompletableFuture<MessageId>> sends = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            sends.add(p.newMessage().key("k" + (i % 7)).property("i", Integer.toString(i))
                    .eventTime(1_000_000L + i).value(bytes(String.format("m-%04d-%s", i, filler)))
                    .sendAsync());
        }
        p.flush();
        for (CompletableFuture<MessageId> f : sends) {
            await(f, OP_TIMEOUT_S, "send");
        }
        int batched = 0;
        List<Message<byte[]>> got = receiveN(cons, n);
        for (int i = 0; i < n; i++) {
            Message<byte[]> m = got.get(i);
            assertEquals(String.format("m-%04d-%s", i, filler), new String(m.getData()), "message " + i);
            assertEquals("k" + (i % 7), m.getKey());
            assertEquals(Integer.toString(i), m.getProperty("i"));
            assertEquals(1_000_000L + i, m.getEventTime());
            if (adv(m.getMessageId()).getBatchSize() > 1) {
                batched++;
            }
            cons.acknowledge(m);
        }
        assertTrue(batched > 0, "no message arrived inside a batch");
        assertNothingMore(cons);
    }

    /** Without batching every message is an entry of its own; raw bytes survive untouched,
     * including NULs, 0xff and an empty payload. */
    @Test
    void unbatchedRawBytes() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("raw");
        Consumer<byte[]> cons = closeLater(c.newConsumer().topic(topic).subscriptionName("s")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe());
        Producer<byte[]> p = closeLater(c.newProducer().topic(topic).enableBatching(false).create());
        byte[] all = new byte[256];
        for (int i = 0; i < all.length; i++) {
            all[i] = (byte) i;
        }
        byte[][] payloads = {all, {0}, {(byte) 0xff, (byte) 0xfe, 0, (byte) 0x80}, new byte[0], new byte[4096]};
        Set<Long> entries = new HashSet<>();
        for (byte[] b : payloads) {
            entries.add(adv(p.send(b)).getEntryId());
        }
        assertEquals(payloads.length, entries.size(), "each unbatched send is an entry of its own");
        for (byte[] want : payloads) {
            Message<byte[]> m = receive(cons);
            assertArrayEquals(want, m.getData());
            assertEquals(-1, adv(m.getMessageId()).getBatchIndex(), "unbatched message with a batch index");
            cons.acknowledge(m);
        }
        assertNothingMore(cons);
    }

    /** String schema end to end, and the message id a send returns is the one the consumer sees. */
    @Test
    void sendReceiptMatchesReceivedId() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("ids");
        Consumer<String> cons = closeLater(c.newConsumer(Schema.STRING).topic(topic).subscriptionName("s")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe());
        Producer<String> p = closeLater(c.newProducer(Schema.STRING).topic(topic)
                .enableBatching(false).create());
        List<MessageId> ids = new ArrayList<>();
        for (int i = 0; i < 5; i++) {
            ids.add(p.send("s" + i));
        }
        for (int i = 0; i < 5; i++) {
            Message<String> m = receive(cons);
            assertEquals("s" + i, m.getValue());
            assertEquals(ids.get(i), m.getMessageId());
            assertEquals(topic, m.getTopicName());
            assertTrue(m.getPublishTime() > 0, "publish time not set");
            cons.acknowledge(m);
        }
    }
}
