package magnetar.compat;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.MessageId;
import org.apache.pulsar.client.api.MessageIdAdv;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.Schema;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * Needs a broker whose ledgers are replicated on storage nodes and roll over often:
 * tests/compat/test_replicated.py starts etcd, the nodes and such a broker
 * (max_entries_per_ledger = MAGNETAR_TEST_ENTRIES_PER_LEDGER, write and ack quorum 2) and runs
 * this class alone; the pom leaves it out of the suite's run against the standalone.
 *
 * <p>The Java client, like every official one, closes the connection when a receipt comes for a
 * later message than the oldest one pending ("Got ack for msg ... expecting ..."), and resends
 * what is pending: the topic then stores those messages twice. At a ledger rollover the next
 * ledger's first entries can be durable on its nodes before the full ledger's last ones; their
 * receipts must still come in send order.
 */
class ReplicatedRolloverTest extends PulsarTestBase {

    @Test
    @Timeout(120)
    void receiptsComeInSendOrderAcrossRolloversAndNothingIsStoredTwice() throws Exception {
        int perLedger = Integer.parseInt(setting("MAGNETAR_TEST_ENTRIES_PER_LEDGER",
                "magnetar.entriesPerLedger"));
        int n = 5000;
        PulsarClient c = client();
        String topic = uniqueTopic("rollovers");
        Producer<String> p = closeLater(c.newProducer(Schema.STRING).topic(topic)
                .enableBatching(false).maxPendingMessages(2000).blockIfQueueFull(true)
                .sendTimeout(30, TimeUnit.SECONDS).create());

        // The callbacks record the order the receipts were handed to the application in.
        ConcurrentLinkedQueue<Integer> answerOrder = new ConcurrentLinkedQueue<>();
        List<CompletableFuture<MessageId>> sends = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            int index = i;
            sends.add(p.sendAsync(Integer.toString(i)).whenComplete((id, e) -> answerOrder.add(index)));
        }
        p.flush();
        await(CompletableFuture.allOf(sends.toArray(new CompletableFuture[0])), 60,
                "every send answered");

        List<Integer> order = new ArrayList<>(answerOrder);
        for (int k = 0; k < n; k++) {
            if (order.get(k) != k) {
                fail("answer " + k + " is for send " + order.get(k) + ": not in send order");
            }
        }
        Set<Long> ledgers = new HashSet<>();
        MessageIdAdv previous = null;
        for (int k = 0; k < n; k++) {
            MessageIdAdv id = adv(sends.get(k).get());
            if (previous != null && !before(previous, id)) {
                fail("send " + k + " stored at " + id + ", not after send " + (k - 1) + " at " + previous);
            }
            previous = id;
            ledgers.add(id.getLedgerId());
        }
        assertTrue(ledgers.size() >= n / perLedger,
                "the sends crossed " + ledgers.size() + " ledgers, expected at least " + n / perLedger);

        Consumer<String> cons = closeLater(c.newConsumer(Schema.STRING).topic(topic)
                .subscriptionName("all").subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                .receiverQueueSize(1000).subscribe());
        List<Message<String>> got = receiveN(cons, n);
        for (int i = 0; i < n; i++) {
            assertEquals(Integer.toString(i), got.get(i).getValue(), "message " + i + ": every message once, in order");
        }
        cons.acknowledgeCumulative(got.get(n - 1).getMessageId());
        assertNothingMore(cons); // a resent message would be a second copy
        System.out.println(n + " sends over " + ledgers.size()
                + " ledgers, answered and stored in order, each once");
    }

    private static boolean before(MessageIdAdv a, MessageIdAdv b) {
        if (a.getLedgerId() != b.getLedgerId()) {
            return a.getLedgerId() < b.getLedgerId();
        }
        return a.getEntryId() < b.getEntryId();
    }
}
