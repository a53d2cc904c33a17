package magnetar.compat;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.MessageId;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.Reader;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.junit.jupiter.api.Test;

/** Readers (earliest, latest, from a message id, inclusive) and seek by id and by time. */
class ReaderSeekTest extends PulsarTestBase {

    private List<MessageId> produce(PulsarClient c, String topic, int n) throws Exception {
        List<MessageId> ids = new ArrayList<>();
        try (Producer<byte[]> p = c.newProducer().topic(topic).enableBatching(false).create()) {
            for (int i = 0; i < n; i++) {
                ids.add(p.send(bytes("m" + i)));
            }
        }
        return ids;
    }

    private static List<String> range(int from, int to) {
        List<String> l = new ArrayList<>();
        for (int i = from; i < to; i++) {
            l.add("m" + i);
        }
        return l;
    }

    private static List<String> readAll(Reader<byte[]> r, int n) throws Exception {
        List<String> got = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            got.add(text(readNext(r)));
        }
        return got;
    }

    @Test
    void readerFromEarliestAndLatest() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("reader");
        produce(c, topic, 5);
        Reader<byte[]> early = closeLater(c.newReader().topic(topic).startMessageId(MessageId.earliest).create());
        assertEquals(range(0, 5), readAll(early, 5));
        assertFalse(early.hasMessageAvailable(), "hasMessageAvailable after reading everything");
        assertReaderDone(early);

        Reader<byte[]> late = closeLater(c.newReader().topic(topic).startMessageId(MessageId.latest).create());
        assertFalse(late.hasMessageAvailable(), "a reader at latest has nothing yet");
        try (Producer<byte[]> p = c.newProducer().topic(topic).enableBatching(false).create()) {
            p.send(bytes("new"));
        }
        assertEquals("new", text(readNext(late)));
        assertEquals("new", text(readNext(early)));
    }

    @Test
    void readerFromMessageIdExclusiveAndInclusive() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("reader-id");
        List<MessageId> ids = produce(c, topic, 6);
        Reader<byte[]> after = closeLater(c.newReader().topic(topic).startMessageId(ids.get(2)).create());
        assertEquals(range(3, 6), readAll(after, 3));
        assertReaderDone(after);
        Reader<byte[]> from = closeLater(c.newReader().topic(topic).startMessageId(ids.get(2))
                .startMessageIdInclusive().create());
        assertTrue(from.hasMessageAvailable());
        assertEquals(range(2, 6), readAll(from, 4));
        assertReaderDone(from);
    }

    /** Reader inside a batch: starting after the 3rd message of a batch gives the 4th onward. */
    @Test
    void readerFromMessageIdInsideBatch() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("reader-batch");
        List<MessageId> ids = new ArrayList<>();
        try (Producer<byte[]> p = c.newProducer().topic(topic).enableBatching(true).batchingMaxMessages(6)
                .batchingMaxPublishDelay(10, java.util.concurrent.TimeUnit.SECONDS).create()) {
            List<java.util.concurrent.CompletableFuture<MessageId>> fs = new ArrayList<>();
            for (int i = 0; i < 6; i++) {
                fs.add(p.sendAsync(bytes("m" + i)));
            }
            p.flush();
            for (var f : fs) {
                ids.add(await(f, OP_TIMEOUT_S, "send"));
            }
        }
        assertTrue(sameEntry(ids.get(0), ids.get(5)), "not one batch: " + ids);
        Reader<byte[]> r = closeLater(c.newReader().topic(topic).startMessageId(ids.get(2)).create());
        assertEquals(range(3, 6), readAll(r, 3));
        assertReaderDone(r);
    }

    /** Consumer seek to a message id: the subscription is rewound and delivery starts right
     * after that message (the Java client, like a reader, does not redeliver the message
     * sought to); seek to earliest replays everything. */
    @Test
    void consumerSeekToMessageId() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("seek-id");
        List<MessageId> ids = produce(c, topic, 6);
        Consumer<byte[]> cons = closeLater(c.newConsumer().topic(topic).subscriptionName("s")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe());
        for (Message<byte[]> m : receiveN(cons, 6)) {
            cons.acknowledge(m);
        }
        assertNothingMore(cons);
        cons.seek(ids.get(2));
        assertSameTexts(range(3, 6), receiveN(cons, 3));
        assertNothingMore(cons);
        cons.seek(MessageId.earliest);
        assertSameTexts(range(0, 6), receiveN(cons, 6));
    }

    /** Seek by publish time: the next message is the first published at or after it. */
    @Test
    void consumerAndReaderSeekByTime() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("seek-time");
        List<Long> times = new ArrayList<>();
        try (Producer<byte[]> p = c.newProducer().topic(topic).enableBatching(false).create()) {
            for (int i = 0; i < 3; i++) {
                p.send(bytes("m" + i));
            }
            Thread.sleep(300); // publish times must differ: a gap between m2 and m3
            for (int i = 3; i < 6; i++) {
                p.send(bytes("m" + i));
            }
        }
        Consumer<byte[]> cons = closeLater(c.newConsumer().topic(topic).subscriptionName("s")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe());
        for (Message<byte[]> m : receiveN(cons, 6)) {
            times.add(m.getPublishTime());
            cons.acknowledge(m);
        }
        assertTrue(times.get(3) > times.get(2), "publish times " + times);
        cons.seek(times.get(3));
        assertSameTexts(range(3, 6), receiveN(cons, 3));
        assertNothingMore(cons);

        Reader<byte[]> r = closeLater(c.newReader().topic(topic).startMessageId(MessageId.earliest).create());
        r.seek(times.get(3));
        assertEquals(range(3, 6), readAll(r, 3));
        r.seek(0L);
        assertEquals("m0", text(readNext(r)));
    }
}
