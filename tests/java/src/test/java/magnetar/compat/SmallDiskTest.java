package magnetar.compat;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.PulsarClientException;
import org.apache.pulsar.client.api.Schema;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * Needs a broker whose disk really fills up: tests/compat/test_limits.py starts one on a 48 MiB
 * file system of its own (min_free_mb = 0, an 8 MiB reserve), runs this class alone with the
 * topic in MAGNETAR_SMALL_DISK_TOPIC, then deletes the topic and checks that the disk comes back.
 * The pom leaves it out of the suite's run against the standalone.
 *
 * <p>When the disk fills, the broker closes the topic's producers and refuses to create them again
 * while short of disk (ProducerBlockedQuotaExceededException, "disk full: ..."). The Java client,
 * reconnecting, fails what it has pending with that exception and keeps reconnecting with
 * back-off: the send fails promptly instead of being resent over and over.
 */
class SmallDiskTest extends PulsarTestBase {

    @Test
    @Timeout(120)
    void aDiskThatFillsUpFailsSendsAndKeepsWhatWasAcknowledged() throws Exception {
        String topic = setting("MAGNETAR_SMALL_DISK_TOPIC", "magnetar.smallDiskTopic");
        PulsarClient c = client();
        Consumer<byte[]> cons = closeLater(c.newConsumer(Schema.BYTES).topic(topic)
                .subscriptionName("keep").receiverQueueSize(100).subscribe());
        Producer<byte[]> p = closeLater(c.newProducer(Schema.BYTES).topic(topic)
                .enableBatching(false).sendTimeout(10, TimeUnit.SECONDS).create());

        byte[] payload = new byte[64 * 1024];
        List<Long> acknowledged = new ArrayList<>();
        PulsarClientException refused = null;
        long started = System.nanoTime();
        for (long i = 0; i < 2000; i++) { // 125 MiB: far more than the disk holds
            ByteBuffer.wrap(payload).putLong(i);
            try {
                // Bounded: a send neither stored nor failed (the old send-error loop) fails here.
                await(p.sendAsync(payload), 30, "send " + i);
            } catch (PulsarClientException e) {
                refused = e;
                break;
            }
            acknowledged.add(i);
        }
        if (refused == null) {
            fail("the disk never filled up: " + acknowledged.size() + " sends acknowledged");
        }
        assertTrue(refused instanceof PulsarClientException.ProducerBlockedQuotaExceededException,
                "after " + acknowledged.size() + " sends: " + refused
                        + ", want ProducerBlockedQuotaExceededException");
        long tookS = TimeUnit.NANOSECONDS.toSeconds(System.nanoTime() - started);
        assertTrue(tookS <= 60, "filling the disk and the refusal took " + tookS + " s");
        assertTrue(acknowledged.size() >= 300,
                "only " + acknowledged.size() + " sends acknowledged before the refusal");

        List<Message<byte[]>> received = receiveN(cons, acknowledged.size());
        for (int k = 0; k < received.size(); k++) {
            long got = ByteBuffer.wrap(received.get(k).getValue()).getLong();
            assertEquals((long) acknowledged.get(k), got,
                    "message " + k + ": every acknowledged message, in order");
        }
        cons.acknowledgeCumulative(received.get(received.size() - 1).getMessageId());
        System.out.println(acknowledged.size() + " sends acknowledged, then refused: " + refused
                + "; all consumed in order");
    }
}
