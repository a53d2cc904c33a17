package magnetar.compat;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.ConsumerBuilder;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.MessageId;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.client.api.SubscriptionType;
import org.junit.jupiter.api.Test;

/** Individual, cumulative and batch-index acknowledgements, negative acks, ack timeout. */
class AcksTest extends PulsarTestBase {
    private static final int BATCH = 10;

    private ConsumerBuilder<byte[]> consumerBuilder(PulsarClient c, String topic, SubscriptionType type) {
        return c.newConsumer().topic(topic).subscriptionName("s").subscriptionType(type)
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                // the ack is confirmed by the broker before acknowledge() returns
                .isAckReceiptEnabled(true);
    }

    private void sendUnbatched(PulsarClient c, String topic, int n) throws Exception {
        try (Producer<byte[]> p = c.newProducer().topic(topic).enableBatching(false).create()) {
            for (int i = 0; i < n; i++) {
                p.send(bytes("m" + i));
            }
        }
    }

    /** Sends BATCH messages that end up in one batch (one entry); asserts it. */
    private List<MessageId> sendOneBatch(PulsarClient c, String topic) throws Exception {
        try (Producer<byte[]> p = c.newProducer().topic(topic).enableBatching(true)
                .batchingMaxMessages(BATCH).batchingMaxPublishDelay(10, TimeUnit.SECONDS).create()) {
            List<CompletableFuture<MessageId>> fs = new ArrayList<>();
            for (int i = 0; i < BATCH; i++) {
                fs.add(p.sendAsync(bytes("b" + i)));
            }
            p.flush();
            List<MessageId> ids = new ArrayList<>();
            for (CompletableFuture<MessageId> f : fs) {
                ids.add(await(f, OP_TIMEOUT_S, "batched send"));
            }
            for (int i = 0; i < BATCH; i++) {
                assertTrue(sameEntry(ids.get(0), ids.get(i)), "the messages did not form one batch: " + ids);
                assertEquals(i, adv(ids.get(i)).getBatchIndex(), "batch index in " + ids);
            }
            return ids;
        }
    }

    private static List<String> range(String prefix, int from, int to) {
        List<String> l = new ArrayList<>();
        for (int i = from; i < to; i++) {
            l.add(prefix + i);
        }
        return l;
    }

    /** Individually acked messages are not redelivered to the next consumer; the others are. */
    @Test
    void individualAckSurvivesResubscribe() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("ack-ind");
        sendUnbatched(c, topic, 6);
        Consumer<byte[]> cons = consumerBuilder(c, topic, SubscriptionType.Exclusive).subscribe();
        List<Message<byte[]>> got = receiveN(cons, 6);
        for (int i : new int[] {0, 2, 3, 5}) {
            cons.acknowledge(got.get(i));
        }
        cons.close();
        Consumer<byte[]> again = closeLater(consumerBuilder(c, topic, SubscriptionType.Exclusive).subscribe());
        assertSameTexts(List.of("m1", "m4"), receiveN(again, 2));
        assertNothingMore(again);
    }

    /** A cumulative ack acknowledges everything up to and including that message. */
    @Test
    void cumulativeAckSurvivesResubscribe() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("ack-cum");
        sendUnbatched(c, topic, 6);
        Consumer<byte[]> cons = consumerBuilder(c, topic, SubscriptionType.Failover).subscribe();
        List<Message<byte[]>> got = receiveN(cons, 6);
        cons.acknowledgeCumulative(got.get(3));
        cons.close();
        Consumer<byte[]> again = closeLater(consumerBuilder(c, topic, SubscriptionType.Failover).subscribe());
        assertSameTexts(List.of("m4", "m5"), receiveN(again, 2));
        assertNothingMore(again);
    }

    /** Without batch-index acks (the client default), acking part of a batch acknowledges
     * nothing on the broker: the whole batch comes back after re-subscribing. */
    @Test
    void partialBatchAckWithoutBatchIndexAckRedeliversWholeBatch() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("ack-batch-noidx");
        sendOneBatch(c, topic);
        Consumer<byte[]> cons = consumerBuilder(c, topic, SubscriptionType.Shared).subscribe();
        List<Message<byte[]>> got = receiveN(cons, BATCH);
        for (int i = 0; i < BATCH / 2; i++) {
            cons.acknowledge(got.get(i));
        }
        cons.close();
        Consumer<byte[]> again = closeLater(consumerBuilder(c, topic, SubscriptionType.Shared).subscribe());
        assertSameTexts(range("b", 0, BATCH), receiveN(again, BATCH));
        assertNothingMore(again);
    }

    /** Batch-index acks (enableBatchIndexAcknowledgment): individually acking part of a batch
     * sends an ACK with an ack_set; the broker must keep the rest of the batch unacknowledged,
     * and a new consumer gets exactly the unacked messages of the batch. */
    @Test
    void batchIndexAckIndividualLeavesRestUnacked() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("ack-batchidx-ind");
        sendOneBatch(c, topic);
        Consumer<byte[]> cons = consumerBuilder(c, topic, SubscriptionType.Shared)
                .enableBatchIndexAcknowledgment(true).subscribe();
        List<Message<byte[]>> got = receiveN(cons, BATCH);
        // ack the even indexes: 0, 2, 4, 6, 8
        for (int i = 0; i < BATCH; i += 2) {
            cons.acknowledge(got.get(i));
        }
        cons.close();
        Consumer<byte[]> again = closeLater(consumerBuilder(c, topic, SubscriptionType.Shared)
                .enableBatchIndexAcknowledgment(true).subscribe());
        List<String> want = new ArrayList<>();
        for (int i = 1; i < BATCH; i += 2) {
            want.add("b" + i);
        }
        assertSameTexts(want, receiveN(again, want.size()));
        assertNothingMore(again);
    }

    /** Batch-index acks, cumulative: acking message 3 of a batch cumulatively acknowledges
     * messages 0..3 of it and nothing after; a new consumer gets 4..9. */
    @Test
    void batchIndexAckCumulativeLeavesRestUnacked() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("ack-batchidx-cum");
        sendOneBatch(c, topic);
        Consumer<byte[]> cons = consumerBuilder(c, topic, SubscriptionType.Exclusive)
                .enableBatchIndexAcknowledgment(true).subscribe();
        List<Message<byte[]>> got = receiveN(cons, BATCH);
        cons.acknowledgeCumulative(got.get(3));
        cons.close();
        Consumer<byte[]> again = closeLater(consumerBuilder(c, topic, SubscriptionType.Exclusive)
                .enableBatchIndexAcknowledgment(true).subscribe());
        assertSameTexts(range("b", 4, BATCH), receiveN(again, BATCH - 4));
        assertNothingMore(again);
    }

    /** Acking the rest of a partly batch-index-acked batch completes it: nothing comes back. */
    @Test
    void batchIndexAckAllIndexesAcksTheEntry() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("ack-batchidx-all");
        sendOneBatch(c, topic);
        Consumer<byte[]> cons = consumerBuilder(c, topic, SubscriptionType.Shared)
                .enableBatchIndexAcknowledgment(true).subscribe();
        for (Message<byte[]> m : receiveN(cons, BATCH)) {
            cons.acknowledge(m);
        }
        cons.close();
        Consumer<byte[]> again = closeLater(consumerBuilder(c, topic, SubscriptionType.Shared)
                .enableBatchIndexAcknowledgment(true).subscribe());
        assertNothingMore(again);
    }

    /** A negatively acknowledged message is redelivered (after the nack delay) with its
     * redelivery count raised; acked ones are not. */
    @Test
    void negativeAckRedelivers() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("nack");
        Consumer<byte[]> cons = closeLater(consumerBuilder(c, topic, SubscriptionType.Shared)
                .negativeAckRedeliveryDelay(200, TimeUnit.MILLISECONDS).subscribe());
        sendUnbatched(c, topic, 3);
        List<Message<byte[]>> got = receiveN(cons, 3);
        cons.acknowledge(got.get(0));
        cons.negativeAcknowledge(got.get(1));
        cons.acknowledge(got.get(2));
        Message<byte[]> back = receive(cons);
        assertEquals("m1", text(back));
        assertEquals(got.get(1).getMessageId(), back.getMessageId());
        assertEquals(1, back.getRedeliveryCount(), "redelivery count after one negative ack");
        cons.negativeAcknowledge(back);
        Message<byte[]> twice = receive(cons);
        assertEquals("m1", text(twice));
        assertEquals(2, twice.getRedeliveryCount(), "redelivery count after two negative acks");
        cons.acknowledge(twice);
        assertNothingMore(cons);
    }

    /** With an ack timeout, a message that is received but not acknowledged comes back. */
    @Test
    void ackTimeoutRedelivers() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("ack-timeout");
        Consumer<byte[]> cons = closeLater(consumerBuilder(c, topic, SubscriptionType.Shared)
                .ackTimeout(1, TimeUnit.SECONDS).ackTimeoutTickTime(100, TimeUnit.MILLISECONDS).subscribe());
        sendUnbatched(c, topic, 2);
        List<Message<byte[]>> got = receiveN(cons, 2);
        cons.acknowledge(got.get(0));
        long t0 = System.nanoTime();
        Message<byte[]> back = receive(cons);
        long waitedMs = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0);
        assertEquals("m1", text(back));
        assertEquals(1, back.getRedeliveryCount(), "redelivery count after an ack timeout");
        assertTrue(waitedMs >= 500, "redelivered after " + waitedMs + " ms, before the 1 s ack timeout");
        cons.acknowledge(back);
        assertNothingMore(cons);
    }
}
