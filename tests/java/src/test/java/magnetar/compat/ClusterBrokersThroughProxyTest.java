package magnetar.compat;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.Schema;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * The official Java client through {@code magnetar proxy}: tests/compat/test_proxy.py starts etcd,
 * storage nodes, two brokers and the proxy, creates a namespace of four bundles with
 * deduplication on, and runs this class alone with MAGNETAR_TEST_PROXY_URL (the only service URL
 * the client gets), MAGNETAR_TEST_PROXY_WEB_URL (the proxy's admin API) and
 * MAGNETAR_TEST_NAMESPACE; the pom leaves it out of the suite's run against the standalone.
 */
class ClusterBrokersThroughProxyTest extends PulsarTestBase {

    private static final HttpClient HTTP = HttpClient.newBuilder()
            .connectTimeout(Duration.ofSeconds(5)).build();

    @Test
    @Timeout(180)
    void theProxyIsOneAddressForEveryBroker() throws Exception {
        String proxy = setting("MAGNETAR_TEST_PROXY_URL", "magnetar.proxyUrl");
        String proxyWeb = setting("MAGNETAR_TEST_PROXY_WEB_URL", "magnetar.proxyWebUrl");
        String ns = setting("MAGNETAR_TEST_NAMESPACE", "magnetar.namespace");
        PulsarClient c = client(proxy);
        for (int i = 0; i < 6; i++) {
            String topic = "persistent://" + ns + "/java-proxied-" + i;
            Producer<String> p = closeLater(c.newProducer(Schema.STRING).topic(topic)
                    .enableBatching(false).create());
            Consumer<String> cons = closeLater(c.newConsumer(Schema.STRING).topic(topic)
                    .subscriptionName("s")
                    .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe());
            p.send("m" + i);
            Message<String> m = receiveN(cons, 1).get(0);
            assertEquals("m" + i, m.getValue(), topic);
            cons.acknowledge(m);
        }

        // A namespace unload (through the proxy's admin API) under synchronous sends: the
        // producer is sent to the bundle's new owner, still through the proxy, and no send fails.
        String topic = "persistent://" + ns + "/java-proxied-queue";
        // The checker's subscription first, so that no closed ledger is trimmed before it.
        c.newConsumer(Schema.STRING).topic(topic).subscriptionName("check")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe().close();
        Producer<String> p = closeLater(c.newProducer(Schema.STRING).topic(topic)
                .enableBatching(false).sendTimeout(30, java.util.concurrent.TimeUnit.SECONDS)
                .producerName("java-proxied").create());
        List<String> acked = new ArrayList<>();
        for (int i = 0; i < 200; i++) {
            if (i == 100) {
                HttpRequest unload = HttpRequest.newBuilder(
                                URI.create(proxyWeb + "/admin/v2/namespaces/" + ns + "/unload"))
                        .timeout(Duration.ofSeconds(30))
                        .PUT(HttpRequest.BodyPublishers.noBody()).build();
                int status = HTTP.send(unload, HttpResponse.BodyHandlers.ofString()).statusCode();
                assertTrue(status == 204 || status == 200, "unload through the proxy: " + status);
            }
            p.newMessage().sequenceId(i).value(Integer.toString(i)).send();
            acked.add(Integer.toString(i));
        }
        Consumer<String> check = closeLater(c.newConsumer(Schema.STRING).topic(topic)
                .subscriptionName("check")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe());
        List<String> got = new ArrayList<>();
        for (Message<String> m : receiveN(check, acked.size())) {
            got.add(m.getValue());
        }
        assertEquals(acked, got, "every acknowledged send once, in order");
        System.out.println("java through the proxy: 6 topics and a queue through an unload");
    }
}
