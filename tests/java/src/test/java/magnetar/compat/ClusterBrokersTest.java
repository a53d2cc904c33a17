package magnetar.compat;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.Schema;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * Three brokers as one service, with the official Java client: tests/compat/test_cluster_brokers.py
 * starts etcd, storage nodes and three {@code magnetar broker}s, creates a namespace of four
 * bundles with deduplication on, and runs this class alone with MAGNETAR_TEST_SERVICE_URLS and
 * MAGNETAR_TEST_WEB_URLS (each broker's, comma-separated, in the same order) and
 * MAGNETAR_TEST_NAMESPACE; the pom leaves it out of the suite's run against the standalone.
 */
class ClusterBrokersTest extends PulsarTestBase {

    private static final HttpClient HTTP = HttpClient.newBuilder()
            .connectTimeout(Duration.ofSeconds(5)).build();
    private static final Pattern BROKER_URL = Pattern.compile("\"brokerUrl\"\\s*:\\s*\"([^\"]+)\"");

    static HttpResult at(String method, String url) throws Exception {
        HttpRequest request = HttpRequest.newBuilder(URI.create(url)).timeout(Duration.ofSeconds(30))
                .method(method, HttpRequest.BodyPublishers.noBody()).build();
        HttpResponse<String> r = HTTP.send(request, HttpResponse.BodyHandlers.ofString());
        return new HttpResult(r.statusCode(), r.body());
    }

    /** The broker URL {@code web}'s HTTP lookup answers for {@code topic}. */
    static String ownerAt(String web, String topic) throws Exception {
        HttpResult r = at("GET", web + "/lookup/v2/topic/" + topic.replace("://", "/"));
        assertHttpOk(r, "lookup of " + topic + " at " + web);
        Matcher m = BROKER_URL.matcher(r.body());
        assertTrue(m.find(), r.body());
        return m.group(1);
    }

    void produceAndConsume(String url, String topic, int n) throws Exception {
        PulsarClient c = client(url);
        Producer<String> p = closeLater(c.newProducer(Schema.STRING).topic(topic)
                .enableBatching(false).create());
        Consumer<String> cons = closeLater(c.newConsumer(Schema.STRING).topic(topic)
                .subscriptionName("s")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe());
        for (int i = 0; i < n; i++) {
            p.send(Integer.toString(i));
        }
        List<Message<String>> got = receiveN(cons, n);
        for (int i = 0; i < n; i++) {
            assertEquals(Integer.toString(i), got.get(i).getValue(), topic + " through " + url);
            cons.acknowledge(got.get(i));
        }
    }

    @Test
    @Timeout(180)
    void threeBrokersAreOneService() throws Exception {
        String[] services = setting("MAGNETAR_TEST_SERVICE_URLS", "magnetar.serviceUrls").split(",");
        String[] webs = setting("MAGNETAR_TEST_WEB_URLS", "magnetar.webUrls").split(",");
        String ns = setting("MAGNETAR_TEST_NAMESPACE", "magnetar.namespace");
        assertEquals(3, services.length);
        assertEquals(3, webs.length);

        // Every broker answers every topic's owner, and a client of any one broker produces and
        // consumes (its lookups redirected to the owner when that is another broker).
        Set<String> owners = new HashSet<>();
        int redirected = 0;
        for (int i = 0; i < 9; i++) {
            String topic = "persistent://" + ns + "/java-t-" + i;
            produceAndConsume(services[i % 3], topic, 10);
            String answer = ownerAt(webs[0], topic);
            for (String web : webs) {
                assertEquals(answer, ownerAt(web, topic), topic + " at " + web);
            }
            owners.add(answer);
            if (!answer.equals(services[i % 3])) {
                redirected++;
            }
        }
        assertTrue(redirected > 0, "every topic was owned by its client's broker: no redirect tried");
        // An HTTP service URL: lookups over HTTP at a broker that may not own the topic.
        produceAndConsume(webs[2], "persistent://" + ns + "/java-over-http", 5);

        // A namespace unload through a broker that does not own the topic, under load: every
        // send acknowledged, each stored once and in order (deduplication is on), on the new
        // owner the producer was sent to.
        String topic = "persistent://" + ns + "/java-queue";
        PulsarClient c = client(String.join(",", services));
        // The checker's subscription first: without one (and without retention) a closed
        // ledger is trimmed at once, as Pulsar trims it.
        c.newConsumer(Schema.STRING).topic(topic).subscriptionName("check")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe().close();
        Producer<String> p = closeLater(c.newProducer(Schema.STRING).topic(topic)
                .producerName("java-checker").enableBatching(false)
                .sendTimeout(30, TimeUnit.SECONDS).create());
        String owner = ownerAt(webs[0], topic);
        String elsewhere = null;
        for (int i = 0; i < 3; i++) {
            if (!services[i].equals(owner)) {
                elsewhere = webs[i];
                break;
            }
        }
        List<Integer> acked = Collections.synchronizedList(new ArrayList<>());
        List<Throwable> failed = Collections.synchronizedList(new ArrayList<>());
        AtomicBoolean stop = new AtomicBoolean();
        Thread sender = new Thread(() -> {
            for (int i = 0; !stop.get(); i++) {
                try {
                    p.newMessage().value(Integer.toString(i)).sequenceId(i).send();
                    acked.add(i);
                } catch (Exception e) {
                    failed.add(e);
                }
            }
        });
        sender.start();
        try {
            waitFor("50 sends acknowledged", () -> acked.size() >= 50);
            HttpResult unloaded = at("PUT", elsewhere + "/admin/v2/namespaces/" + ns + "/unload");
            assertHttpOk(unloaded, "unload through " + elsewhere);
            int after = acked.size();
            waitFor("sends acknowledged after the unload", () -> acked.size() >= after + 50);
        } finally {
            stop.set(true);
            sender.join(60_000);
        }
        assertTrue(failed.isEmpty(), "send errors reached the application: " + failed);
        assertNotEquals(owner, ownerAt(webs[1], topic), "the unloaded bundle stayed on its owner");
        Consumer<String> check = closeLater(c.newConsumer(Schema.STRING).topic(topic)
                .subscriptionName("check").subscribe());
        List<Integer> want = new ArrayList<>(acked);
        List<Message<String>> got = receiveN(check, want.size());
        for (int i = 0; i < want.size(); i++) {
            assertEquals(Integer.toString(want.get(i)), got.get(i).getValue(), "message " + i);
        }
        assertNothingMore(check);
        System.out.println("three brokers: " + owners.size() + " owners of 9 topics; unload under load: "
                + want.size() + " sends acknowledged, consumed once each in order");
    }

    interface Condition {
        boolean holds();
    }

    static void waitFor(String what, Condition condition) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
        while (!condition.holds()) {
            if (System.nanoTime() > deadline) {
                fail("not within 30 s: " + what);
            }
            Thread.sleep(10); // polled: the sending thread's progress
        }
    }
}
