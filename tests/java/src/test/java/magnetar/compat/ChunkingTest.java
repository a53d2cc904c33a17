package magnetar.compat;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Random;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.MessageId;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.Reader;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** Chunked messages (enableChunking, batching off). */
class ChunkingTest extends PulsarTestBase {

    private static byte[] random(int n, long seed) {
        byte[] b = new byte[n];
        new Random(seed).nextBytes(b);
        return b;
    }

    /** 200 KiB in 10 KiB chunks: reassembled whole; the id spans the chunk entries; acking it
     * acks every chunk (a new consumer gets nothing); a reader sees it once. */
    @Test
    void smallChunksReassembled() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("chunk");
        Consumer<byte[]> cons = c.newConsumer().topic(topic).subscriptionName("s")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                .isAckReceiptEnabled(true).subscribe();
        closeLater(cons);
        Producer<byte[]> p = closeLater(c.newProducer().topic(topic).enableBatching(false)
                .enableChunking(true).chunkMaxMessageSize(10 * 1024).create());
        byte[] big = random(200 * 1024, 1);
        MessageId bigId = p.newMessage().key("big").value(big).property("p", "v").send();
        MessageId smallId = p.send(bytes("small-after"));

        Message<byte[]> m = receive(cons);
        assertArrayEquals(big, m.getData(), "chunked message not reassembled equal");
        assertEquals("big", m.getKey());
        assertEquals("v", m.getProperty("p"));
        assertEquals(bigId, m.getMessageId());
        // the id of the small message follows the last chunk entry: at least 20 chunk entries
        assertTrue(adv(smallId).getEntryId() >= 20, "small message at entry " + adv(smallId).getEntryId()
                + ": fewer than 20 chunk entries before it");
        Message<byte[]> small = receive(cons);
        assertEquals("small-after", text(small));
        cons.acknowledge(m);
        cons.acknowledge(small);
        cons.close();

        Consumer<byte[]> again = closeLater(c.newConsumer().topic(topic).subscriptionName("s").subscribe());
        assertNothingMore(again);

        Reader<byte[]> r = closeLater(c.newReader().topic(topic).startMessageId(MessageId.earliest).create());
        assertArrayEquals(big, readNext(r).getData());
        assertEquals("small-after", text(readNext(r)));
        assertReaderDone(r);
    }

    /** A message bigger than the broker's maxMessageSize (5 MiB by default, told to the client
     * in CONNECTED): split in chunks of the broker's size, reassembled equal. */
    @Test
    @Timeout(60)
    void messageLargerThanMaxMessageSize() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("chunk-big");
        Consumer<byte[]> cons = closeLater(c.newConsumer().topic(topic).subscriptionName("s")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe());
        Producer<byte[]> p = closeLater(c.newProducer().topic(topic).enableBatching(false)
                .enableChunking(true).sendTimeout(60, java.util.concurrent.TimeUnit.SECONDS).create());
        byte[] big = random(11 * 1024 * 1024, 2);
        p.send(big);
        p.send(bytes("after"));
        Message<byte[]> m = receive(cons, 40);
        assertArrayEquals(big, m.getData(), "11 MiB chunked message not reassembled equal");
        cons.acknowledge(m);
        Message<byte[]> after = receive(cons);
        assertEquals("after", text(after));
        // 11 MiB in chunks of at most 5 MiB: at least 3 entries before "after"
        assertTrue(adv(after.getMessageId()).getEntryId() >= 3,
                "after the 11 MiB message at entry " + adv(after.getMessageId()).getEntryId());
    }
}
