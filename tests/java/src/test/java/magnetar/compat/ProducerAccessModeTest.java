package magnetar.compat;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.ProducerAccessMode;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.PulsarClientException;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** Producer access modes: Exclusive, WaitForExclusive and ExclusiveWithFencing. */
class ProducerAccessModeTest extends PulsarTestBase {

    private Producer<byte[]> producer(PulsarClient c, String topic, ProducerAccessMode mode) throws Exception {
        return closeLater(c.newProducer().topic(topic).accessMode(mode).enableBatching(false).create());
    }

    /** A second Exclusive producer is fenced: ProducerFencedException (not ProducerBusy), at
     * once; the first keeps working. */
    @Test
    void exclusiveProducerFencesSecondExclusive() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("excl-prod");
        Producer<byte[]> first = producer(c, topic, ProducerAccessMode.Exclusive);
        long t0 = System.nanoTime();
        PulsarClientException e = assertThrows(PulsarClientException.class,
                () -> producer(c, topic, ProducerAccessMode.Exclusive));
        assertInstanceOf(PulsarClientException.ProducerFencedException.class, e,
                "second Exclusive producer: want ProducerFencedException, got " + e);
        long ms = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0);
        assertFalse(ms > 10_000, "the refusal took " + ms + " ms");
        first.send(bytes("still mine"));
    }

    /** An Exclusive producer is fenced when Shared producers are already there. */
    @Test
    void exclusiveProducerFencedBySharedProducer() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("excl-after-shared");
        Producer<byte[]> shared = producer(c, topic, ProducerAccessMode.Shared);
        PulsarClientException e = assertThrows(PulsarClientException.class,
                () -> producer(c, topic, ProducerAccessMode.Exclusive));
        assertInstanceOf(PulsarClientException.ProducerFencedException.class, e,
                "Exclusive producer beside a Shared one: want ProducerFencedException, got " + e);
        shared.send(bytes("ok"));
    }

    /** A Shared producer is refused while an Exclusive one holds the topic (Pulsar answers
     * ProducerBusy here); after the Exclusive producer closes a Shared one is accepted. */
    @Test
    void sharedProducerRefusedWhileExclusiveHeld() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("shared-after-excl");
        Producer<byte[]> excl = producer(c, topic, ProducerAccessMode.Exclusive);
        assertThrows(PulsarClientException.ProducerBusyException.class,
                () -> producer(c, topic, ProducerAccessMode.Shared));
        excl.close();
        producer(c, topic, ProducerAccessMode.Shared).send(bytes("ok"));
    }

    /** WaitForExclusive: the second producer is not refused but waits (createAsync() does not
     * complete) while the first holds the topic. Meanwhile the same client (same connection)
     * keeps working: the first producer sends, another topic's producer and consumer work.
     * When the first closes, the waiting one completes and can send. */
    @Test
    @Timeout(40)
    void waitForExclusiveProducerWaitsThenTakesOver() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("wait-excl");
        Consumer<byte[]> cons = closeLater(c.newConsumer().topic(topic).subscriptionName("s")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe());
        Producer<byte[]> first = producer(c, topic, ProducerAccessMode.Exclusive);
        first.send(bytes("first-1"));

        CompletableFuture<Producer<byte[]>> waiting = c.newProducer().topic(topic)
                .accessMode(ProducerAccessMode.WaitForExclusive).enableBatching(false).createAsync();
        waiting.thenAccept(this::closeLater);
        Thread.sleep(1500); // nothing to await: we check that something does NOT happen
        assertFalse(waiting.isDone(), "WaitForExclusive producer did not wait: " + waiting);

        // the connection is not blocked by the waiting producer
        await(first.sendAsync(bytes("first-2")), 10, "send by the exclusive producer while another waits");
        assertEquals("first-1", text(receive(cons)));
        assertEquals("first-2", text(receive(cons)));
        String other = uniqueTopic("wait-excl-other");
        Consumer<byte[]> otherCons = closeLater(await(c.newConsumer().topic(other).subscriptionName("s")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribeAsync(),
                10, "subscribe on the same client while a producer waits"));
        Producer<byte[]> otherProd = closeLater(await(c.newProducer().topic(other).enableBatching(false)
                .createAsync(), 10, "create a producer on the same client while a producer waits"));
        await(otherProd.sendAsync(bytes("other")), 10, "send on another topic while a producer waits");
        assertEquals("other", text(receive(otherCons)));
        assertFalse(waiting.isDone(), "WaitForExclusive producer completed while the first is open");

        await(first.closeAsync(), 10, "close the exclusive producer");
        Producer<byte[]> second = await(waiting, 10, "WaitForExclusive producer after the first closed");
        await(second.sendAsync(bytes("second-1")), 10, "send by the producer that waited");
        assertEquals("second-1", text(receive(cons)));
    }

    /** A WaitForExclusive producer on a free topic gets it at once; an Exclusive producer
     * beside it is then fenced (ProducerFencedException). */
    @Test
    void exclusiveProducerFencedByWaitForExclusiveHolder() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("wait-excl-free");
        Producer<byte[]> p = closeLater(await(c.newProducer().topic(topic)
                .accessMode(ProducerAccessMode.WaitForExclusive).enableBatching(false).createAsync(),
                10, "WaitForExclusive producer on a free topic"));
        await(p.sendAsync(bytes("x")), 10, "send");
        PulsarClientException e = assertThrows(PulsarClientException.class,
                () -> producer(c, topic, ProducerAccessMode.Exclusive));
        assertInstanceOf(PulsarClientException.ProducerFencedException.class, e,
                "Exclusive producer beside a WaitForExclusive holder: want ProducerFencedException, got " + e);
    }

    /** ExclusiveWithFencing takes the topic from an Exclusive holder on another client: the
     * holder reconnects with its topic epoch, meets the new holder and is fenced for good (its
     * next send fails with ProducerFencedException); a consumer on a third client gets what
     * each sent while it held the topic, once. */
    @Test
    @Timeout(60)
    void exclusiveWithFencingFencesTheHolder() throws Exception {
        String topic = uniqueTopic("excl-fencing");
        Consumer<byte[]> cons = closeLater(client().newConsumer().topic(topic).subscriptionName("s")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe());
        Producer<byte[]> holder = producer(client(), topic, ProducerAccessMode.Exclusive);
        holder.send(bytes("from-holder"));
        Producer<byte[]> fencer = producer(client(), topic, ProducerAccessMode.ExclusiveWithFencing);
        fencer.send(bytes("from-fencer"));
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
        PulsarClientException fenced = null;
        while (fenced == null) {
            try {
                holder.sendAsync(bytes("from-fenced")).get(10, TimeUnit.SECONDS);
            } catch (java.util.concurrent.ExecutionException e) {
                if (e.getCause() instanceof PulsarClientException pce) {
                    fenced = pce;
                } else {
                    throw e;
                }
            }
            assertFalse(fenced == null && System.nanoTime() > deadline,
                    "the fenced holder still sends 30 s after the fencing producer took the topic");
        }
        assertInstanceOf(PulsarClientException.ProducerFencedException.class, fenced,
                "the fenced holder's send: want ProducerFencedException, got " + fenced);
        assertEquals("from-holder", text(receive(cons)));
        assertEquals("from-fencer", text(receive(cons)));
        assertNothingMore(cons);
    }
}
