package magnetar.compat;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.ConsumerEventListener;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.PulsarClientException;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.client.api.SubscriptionType;
import org.junit.jupiter.api.Test;

/** The four subscription types. */
class SubscriptionTypesTest extends PulsarTestBase {

    private Consumer<byte[]> subscribe(PulsarClient c, String topic, SubscriptionType type, String name)
            throws PulsarClientException {
        return closeLater(c.newConsumer().topic(topic).subscriptionName("s").subscriptionType(type)
                .consumerName(name).receiverQueueSize(10)
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe());
    }

    private void sendTexts(Producer<byte[]> p, String prefix, int n) throws PulsarClientException {
        for (int i = 0; i < n; i++) {
            p.send(bytes(prefix + i));
        }
    }

    /** A second consumer on an Exclusive subscription is refused with ConsumerBusy; the first
     * keeps receiving. */
    @Test
    void exclusiveRefusesSecondConsumer() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("excl");
        Consumer<byte[]> first = subscribe(c, topic, SubscriptionType.Exclusive, "a");
        assertThrows(PulsarClientException.ConsumerBusyException.class,
                () -> closeLater(c.newConsumer().topic(topic).subscriptionName("s")
                        .subscriptionType(SubscriptionType.Exclusive).subscribe()));
        Producer<byte[]> p = closeLater(c.newProducer().topic(topic).enableBatching(false).create());
        p.send(bytes("x"));
        assertEquals("x", text(receive(first)));
    }

    /** Failover: one active consumer gets everything; when it leaves, the standby takes over
     * the unacknowledged rest. */
    @Test
    void failoverStandbyTakesOver() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("failover");
        Consumer<byte[]> a = subscribe(c, topic, SubscriptionType.Failover, "a");
        Consumer<byte[]> b = subscribe(c, topic, SubscriptionType.Failover, "b");
        Producer<byte[]> p = closeLater(c.newProducer().topic(topic).enableBatching(false).create());
        sendTexts(p, "m", 6);

        // Exactly one of them is active (which one is the broker's choice): it gets all six,
        // the other none.
        Message<byte[]> firstMsg = null;
        Consumer<byte[]> active = null;
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(RECEIVE_TIMEOUT_S);
        while (firstMsg == null && System.nanoTime() < deadline) {
            for (Consumer<byte[]> cons : List.of(a, b)) {
                firstMsg = cons.receive(50, TimeUnit.MILLISECONDS);
                if (firstMsg != null) {
                    active = cons;
                    break;
                }
            }
        }
        assertNotNull(firstMsg, "neither Failover consumer received anything");
        Consumer<byte[]> standby = active == a ? b : a;
        assertEquals("m0", text(firstMsg));
        active.acknowledge(firstMsg);
        List<Message<byte[]>> rest = receiveN(active, 2);
        assertSameTexts(List.of("m1", "m2"), rest);
        for (Message<byte[]> m : rest) {
            active.acknowledge(m);
        }
        assertNothingMore(standby);

        active.close();
        // m3..m5 (maybe already in the old active's queue, never acked) go to the standby
        List<Message<byte[]>> taken = receiveN(standby, 3);
        assertSameTexts(List.of("m3", "m4", "m5"), taken);
    }

    /** The client's ConsumerEventListener is told who is active (ACTIVE_CONSUMER_CHANGE, sent
     * after the SUBSCRIBE's SUCCESS so the client knows the consumer): a lone consumer becomes
     * active; when a second joins, exactly one of the two is active (on a non-partitioned topic
     * Pulsar picks it by a hash ring of consumer names) and each is told its state; when the
     * active one closes, the other becomes active and gets the messages. */
    @Test
    void failoverActiveConsumerChangeEvents() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("failover-events");
        BlockingQueue<String> eventsA = new LinkedBlockingQueue<>();
        BlockingQueue<String> eventsB = new LinkedBlockingQueue<>();
        Consumer<byte[]> a = closeLater(c.newConsumer().topic(topic).subscriptionName("s")
                .subscriptionType(SubscriptionType.Failover).consumerName("a")
                .consumerEventListener(recorder(eventsA)).subscribe());
        assertEquals("active", eventsA.poll(RECEIVE_TIMEOUT_S, TimeUnit.SECONDS),
                "the only consumer of a Failover subscription: becameActive expected");

        Consumer<byte[]> b = closeLater(c.newConsumer().topic(topic).subscriptionName("s")
                .subscriptionType(SubscriptionType.Failover).consumerName("b")
                .consumerEventListener(recorder(eventsB)).subscribe());
        String stateB = eventsB.poll(RECEIVE_TIMEOUT_S, TimeUnit.SECONDS);
        assertNotNull(stateB, "second consumer: no becameActive / becameInactive within "
                + RECEIVE_TIMEOUT_S + " s");
        Consumer<byte[]> active;
        Consumer<byte[]> standby;
        BlockingQueue<String> standbyEvents;
        if (stateB.equals("inactive")) {
            // a stays active: it may be told so again, but never inactive
            String againA = eventsA.poll(QUIET_MS, TimeUnit.MILLISECONDS);
            assertTrue(againA == null || againA.equals("active"), "a (still active) was told " + againA);
            active = a;
            standby = b;
            standbyEvents = eventsB;
        } else {
            assertEquals("inactive", eventsA.poll(RECEIVE_TIMEOUT_S, TimeUnit.SECONDS),
                    "b became active, so a must be told it is inactive");
            active = b;
            standby = a;
            standbyEvents = eventsA;
        }

        Producer<byte[]> p = closeLater(c.newProducer().topic(topic).enableBatching(false).create());
        p.send(bytes("first"));
        Message<byte[]> first = receive(active);
        assertEquals("first", text(first));
        active.acknowledge(first);
        assertNothingMore(standby);

        active.close();
        assertEquals("active", standbyEvents.poll(RECEIVE_TIMEOUT_S, TimeUnit.SECONDS),
                "after the active consumer closed, the standby: becameActive expected");
        p.send(bytes("second"));
        assertEquals("second", text(receive(standby)));
    }

    private static ConsumerEventListener recorder(BlockingQueue<String> q) {
        return new ConsumerEventListener() {
            @Override
            public void becameActive(Consumer<?> consumer, int partitionId) {
                q.add("active");
            }

            @Override
            public void becameInactive(Consumer<?> consumer, int partitionId) {
                q.add("inactive");
            }
        };
    }

    /** Shared: the messages are split between the consumers, each delivered exactly once. */
    @Test
    void sharedSplitsEachMessageOnce() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("shared");
        Consumer<byte[]> a = subscribe(c, topic, SubscriptionType.Shared, "a");
        Consumer<byte[]> b = subscribe(c, topic, SubscriptionType.Shared, "b");
        Producer<byte[]> p = closeLater(c.newProducer().topic(topic).enableBatching(false).create());
        int n = 40;
        sendTexts(p, "m", n);
        Set<String> seen = new HashSet<>();
        int fromA = 0;
        int fromB = 0;
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(RECEIVE_TIMEOUT_S * 2);
        while (seen.size() < n && System.nanoTime() < deadline) {
            for (Consumer<byte[]> cons : List.of(a, b)) {
                Message<byte[]> m = cons.receive(50, TimeUnit.MILLISECONDS);
                if (m != null) {
                    assertTrue(seen.add(text(m)), "delivered twice: " + text(m));
                    cons.acknowledge(m);
                    if (cons == a) {
                        fromA++;
                    } else {
                        fromB++;
                    }
                }
            }
        }
        assertEquals(n, seen.size(), "not every message arrived: " + seen);
        assertTrue(fromA > 0 && fromB > 0, "not split: a got " + fromA + ", b got " + fromB);
        assertNothingMore(a);
        assertNothingMore(b);
    }

    /** Key_Shared: each key goes to exactly one consumer, in order; all messages arrive. */
    @Test
    void keySharedKeepsEachKeyOnOneConsumer() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("key-shared");
        Consumer<byte[]> a = subscribe(c, topic, SubscriptionType.Key_Shared, "a");
        Consumer<byte[]> b = subscribe(c, topic, SubscriptionType.Key_Shared, "b");
        Producer<byte[]> p = closeLater(c.newProducer().topic(topic).enableBatching(false).create());
        int keys = 20;
        int perKey = 3;
        for (int r = 0; r < perKey; r++) {
            for (int k = 0; k < keys; k++) {
                p.newMessage().key("key-" + k).value(bytes("key-" + k + ":" + r)).sendAsync();
            }
        }
        p.flush();
        Map<String, String> owner = new HashMap<>();
        Map<String, Integer> nextSeq = new HashMap<>();
        int total = 0;
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(RECEIVE_TIMEOUT_S * 2);
        while (total < keys * perKey && System.nanoTime() < deadline) {
            for (Consumer<byte[]> cons : List.of(a, b)) {
                Message<byte[]> m = cons.receive(50, TimeUnit.MILLISECONDS);
                if (m == null) {
                    continue;
                }
                String name = cons == a ? "a" : "b";
                String prev = owner.putIfAbsent(m.getKey(), name);
                assertTrue(prev == null || prev.equals(name),
                        "key " + m.getKey() + " went to both consumers");
                int seq = Integer.parseInt(text(m).split(":")[1]);
                assertEquals(nextSeq.getOrDefault(m.getKey(), 0), seq, "order of key " + m.getKey());
                nextSeq.put(m.getKey(), seq + 1);
                cons.acknowledge(m);
                total++;
            }
        }
        assertEquals(keys * perKey, total, "messages received");
        assertTrue(owner.containsValue("a") && owner.containsValue("b"),
                "20 keys all went to one consumer: " + owner);
    }

    /** A consumer's subscription type must match the subscription's: Pulsar refuses a Shared
     * consumer on a subscription that an Exclusive consumer holds. */
    @Test
    void mismatchedSubscriptionTypeRefused() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("sub-mismatch");
        Consumer<byte[]> first = subscribe(c, topic, SubscriptionType.Exclusive, "a");
        assertNotNull(first);
        PulsarClientException e = assertThrows(PulsarClientException.class,
                () -> closeLater(c.newConsumer().topic(topic).subscriptionName("s")
                        .subscriptionType(SubscriptionType.Shared).subscribe()));
        assertFalse(e instanceof PulsarClientException.TimeoutException, "refusal expected, got a time-out: " + e);
    }
}
