package magnetar.compat;

import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.MessageId;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.Schema;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * Admin `unload` five times while the Java client keeps 1,000 sends in flight: every send ends
 * acknowledged and every message is stored. When the broker closes the producer, the client
 * resends what it has no receipt for on its new producer; the broker answers the sends it took
 * before the unload ahead of CLOSE_PRODUCER and leaves later ones unanswered, so a message is
 * lost only if the client fails to resend one it had no receipt for. Each message once is logged,
 * not asserted (Apache Pulsar's broker may store a resent message twice here).
 */
class UnloadUnderLoadTest extends PulsarTestBase {

    @Test
    @Timeout(120)
    void unloadsUnderLoadLoseNothing() throws Exception {
        int wantUnloads = 5;
        PulsarClient c = client();
        String topic = uniqueTopic("unload-under-load");
        // The subscription exists before the sends: retention keeps what it has not consumed.
        closeLater(c.newConsumer(Schema.STRING).topic(topic).subscriptionName("all")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe()).close();
        Producer<String> p = closeLater(c.newProducer(Schema.STRING).topic(topic)
                .enableBatching(false).maxPendingMessages(1000).blockIfQueueFull(true)
                .sendTimeout(60, TimeUnit.SECONDS).create());

        AtomicInteger unloads = new AtomicInteger();
        AtomicBoolean sending = new AtomicBoolean(true);
        List<Integer> statuses = new ArrayList<>();
        Thread unloader = new Thread(() -> {
            while (sending.get()) {
                try {
                    Thread.sleep(100); // pacing: sends go through in between
                    int status = http("PUT", "/admin/v2/persistent/public/default/" + shortName(topic)
                            + "/unload", null).status();
                    synchronized (statuses) {
                        statuses.add(status);
                    }
                    unloads.incrementAndGet();
                } catch (Exception e) {
                    synchronized (statuses) {
                        statuses.add(-1);
                    }
                }
            }
        });
        unloader.start();
        List<CompletableFuture<MessageId>> sends = new ArrayList<>();
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
        try {
            // Sends go on until the unloads have happened (bounded).
            while (unloads.get() < wantUnloads && System.nanoTime() < deadline) {
                sends.add(p.sendAsync(Integer.toString(sends.size())));
            }
            p.flush();
        } finally {
            sending.set(false);
            unloader.join(TimeUnit.SECONDS.toMillis(30));
        }
        int n = sends.size();
        await(CompletableFuture.allOf(sends.toArray(new CompletableFuture[0])), 60, "every send answered");
        synchronized (statuses) {
            assertTrue(statuses.size() >= wantUnloads && statuses.stream().allMatch(s -> s == 200 || s == 204),
                    "unloads answered " + statuses);
        }

        Consumer<String> cons = closeLater(c.newConsumer(Schema.STRING).topic(topic)
                .subscriptionName("all").receiverQueueSize(2000).subscribe());
        int[] copies = new int[n];
        int read = 0;
        while (true) {
            Message<String> m = cons.receive(2, TimeUnit.SECONDS);
            if (m == null) {
                break; // nothing for 2 s: all read
            }
            int i = Integer.parseInt(m.getValue());
            if (i < 0 || i >= n) {
                fail("a message that was never sent: " + m.getValue());
            }
            copies[i]++;
            read++;
            cons.acknowledge(m);
        }
        for (int i = 0; i < n; i++) {
            if (copies[i] == 0) {
                fail("message " + i + " was acknowledged and is not stored (" + read + " read after "
                        + statuses.size() + " unloads)");
            }
        }
        System.out.println(n + " sends over " + statuses.size() + " unloads, all stored; "
                + (read - n) + " stored twice");
    }
}
