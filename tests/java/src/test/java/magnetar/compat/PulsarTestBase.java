package magnetar.compat;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.fail;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.function.Supplier;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.MessageId;
import org.apache.pulsar.client.api.MessageIdAdv;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.PulsarClientException;
import org.apache.pulsar.client.api.Reader;
import org.apache.pulsar.client.api.TableView;
import org.junit.jupiter.api.AfterEach;

/**
 * Shared helpers for the Pulsar-compatibility tests with the official Java client
 * (org.apache.pulsar:pulsar-client). The tests encode Apache Pulsar's behaviour: they must pass
 * against real Pulsar and against Magnetar alike.
 *
 * <p>The broker: environment MAGNETAR_TEST_SERVICE_URL (pulsar://host:port) and
 * MAGNETAR_TEST_WEB_URL (http://host:port), or system properties magnetar.serviceUrl /
 * magnetar.webUrl. Without them every test is skipped (the pytest wrapper treats a skip as a
 * failure).
 *
 * <p>Every wait is bounded; every test gets its own client(s) and unique topic names, and
 * whatever it opened is closed (bounded) after it, even when it failed or hung.
 */
abstract class PulsarTestBase {
    /** One expected message must arrive within this. */
    static final int RECEIVE_TIMEOUT_S = 10;
    /** How long we listen for a message that must not arrive. */
    static final int QUIET_MS = 700;
    /** Bound for one client operation (send, create, subscribe, close). */
    static final int OP_TIMEOUT_S = 15;

    private static final HttpClient HTTP = HttpClient.newBuilder()
            .connectTimeout(Duration.ofSeconds(5)).build();

    private final Deque<Supplier<CompletableFuture<?>>> cleanups = new ArrayDeque<>();

    static String setting(String env, String prop) {
        String v = System.getProperty(prop);
        if (v == null || v.isEmpty()) {
            v = System.getenv(env);
        }
        assumeTrue(v != null && !v.isEmpty(),
                env + " is not set (run through tests/compat/test_java_client.py)");
        return v.replaceAll("/+$", "");
    }

    static String serviceUrl() {
        return setting("MAGNETAR_TEST_SERVICE_URL", "magnetar.serviceUrl");
    }

    static String webUrl() {
        return setting("MAGNETAR_TEST_WEB_URL", "magnetar.webUrl");
    }

    /** A new client for the binary service URL, closed after the test. */
    PulsarClient client() throws PulsarClientException {
        return client(serviceUrl());
    }

    PulsarClient client(String url) throws PulsarClientException {
        PulsarClient c = PulsarClient.builder()
                .serviceUrl(url)
                .operationTimeout(OP_TIMEOUT_S, TimeUnit.SECONDS)
                .connectionTimeout(5, TimeUnit.SECONDS)
                .build();
        // The client's own close waits for its thread pools to wind down (about 2 s): start it
        // after the test and do not wait for it (its producers and consumers are closed first).
        cleanups.push(() -> {
            c.closeAsync();
            return CompletableFuture.completedFuture(null);
        });
        return c;
    }

    <T> Producer<T> closeLater(Producer<T> p) {
        cleanups.push(p::closeAsync);
        return p;
    }

    <T> Consumer<T> closeLater(Consumer<T> c) {
        cleanups.push(c::closeAsync);
        return c;
    }

    <T> Reader<T> closeLater(Reader<T> r) {
        cleanups.push(r::closeAsync);
        return r;
    }

    <T> TableView<T> closeLater(TableView<T> t) {
        cleanups.push(t::closeAsync);
        return t;
    }

    /** Closes what the test opened, newest first; each close bounded (a broken connection must
     * not hold the suite), failures ignored (the test's own assertions decide). */
    @AfterEach
    void closeAll() {
        while (!cleanups.isEmpty()) {
            try {
                cleanups.pop().get().get(5, TimeUnit.SECONDS);
            } catch (Exception | Error ignored) {
                // already closed, or the broker is gone / hung: nothing more to do
            }
        }
    }

    static String uniqueTopic(String prefix) {
        return "persistent://public/default/java-" + prefix + "-"
                + UUID.randomUUID().toString().replace("-", "").substring(0, 16);
    }

    /** persistent://public/default/x -> x */
    static String shortName(String topic) {
        return topic.substring(topic.lastIndexOf('/') + 1);
    }

    static <T> T await(CompletableFuture<T> f, int seconds, String what) throws Exception {
        try {
            return f.get(seconds, TimeUnit.SECONDS);
        } catch (TimeoutException e) {
            throw new AssertionError(what + ": not done within " + seconds + " s", e);
        } catch (ExecutionException e) {
            Throwable cause = e.getCause();
            if (cause instanceof Exception) {
                throw (Exception) cause;
            }
            throw e;
        }
    }

    static <T> Message<T> receive(Consumer<T> c) throws PulsarClientException {
        return receive(c, RECEIVE_TIMEOUT_S);
    }

    static <T> Message<T> receive(Consumer<T> c, int seconds) throws PulsarClientException {
        Message<T> m = c.receive(seconds, TimeUnit.SECONDS);
        assertNotNull(m, "no message within " + seconds + " s on " + c.getTopic());
        return m;
    }

    static <T> List<Message<T>> receiveN(Consumer<T> c, int n) throws PulsarClientException {
        List<Message<T>> got = new ArrayList<>();
        while (got.size() < n) {
            Message<T> m = c.receive(RECEIVE_TIMEOUT_S, TimeUnit.SECONDS);
            if (m == null) {
                fail("received only " + got.size() + " of " + n + " messages on " + c.getTopic()
                        + " (then nothing for " + RECEIVE_TIMEOUT_S + " s); last: " + texts(tail(got)));
            }
            got.add(m);
        }
        return got;
    }

    static void assertNothingMore(Consumer<?> c) throws PulsarClientException {
        Message<?> m = c.receive(QUIET_MS, TimeUnit.MILLISECONDS);
        assertNull(m, () -> "unexpected extra message " + text(m) + " (id " + m.getMessageId() + ")");
    }

    static <T> Message<T> readNext(Reader<T> r) throws PulsarClientException {
        Message<T> m = r.readNext(RECEIVE_TIMEOUT_S, TimeUnit.SECONDS);
        assertNotNull(m, "reader: no message within " + RECEIVE_TIMEOUT_S + " s on " + r.getTopic());
        return m;
    }

    static void assertReaderDone(Reader<?> r) throws PulsarClientException {
        Message<?> m = r.readNext(QUIET_MS, TimeUnit.MILLISECONDS);
        assertNull(m, () -> "reader: unexpected extra message " + text(m));
    }

    static String text(Message<?> m) {
        if (m == null) {
            return "null";
        }
        byte[] d = m.getData();
        String s = new String(d, StandardCharsets.UTF_8);
        return s.length() > 40 ? s.substring(0, 40) + "..." : s;
    }

    static List<String> texts(List<? extends Message<?>> ms) {
        List<String> out = new ArrayList<>();
        for (Message<?> m : ms) {
            out.add(text(m));
        }
        return out;
    }

    static <T> List<T> tail(List<T> l) {
        return l.subList(Math.max(0, l.size() - 5), l.size());
    }

    static byte[] bytes(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    static MessageIdAdv adv(MessageId id) {
        return (MessageIdAdv) id;
    }

    static boolean sameEntry(MessageId a, MessageId b) {
        MessageIdAdv x = adv(a);
        MessageIdAdv y = adv(b);
        return x.getLedgerId() == y.getLedgerId() && x.getEntryId() == y.getEntryId();
    }

    // ------------------------------------------------------------------ admin REST
    record HttpResult(int status, String body) {
    }

    static HttpResult http(String method, String path, String body) throws Exception {
        HttpRequest.Builder b = HttpRequest.newBuilder(URI.create(webUrl() + path))
                .timeout(Duration.ofSeconds(10))
                .header("Accept", "application/json");
        if (body != null) {
            b.header("Content-Type", "application/json");
            b.method(method, HttpRequest.BodyPublishers.ofString(body));
        } else {
            b.method(method, HttpRequest.BodyPublishers.noBody());
        }
        HttpResponse<String> r = HTTP.send(b.build(), HttpResponse.BodyHandlers.ofString());
        return new HttpResult(r.statusCode(), r.body());
    }

    static void assertHttpOk(HttpResult r, String what) {
        if (r.status() < 200 || r.status() >= 300) {
            fail(what + ": HTTP " + r.status() + " " + r.body());
        }
    }

    /** PUT {web}/admin/v2/persistent/public/default/{topic}/partitions with body = n */
    static void createPartitionedTopic(String topic, int n) throws Exception {
        HttpResult r = http("PUT", "/admin/v2/persistent/public/default/" + shortName(topic)
                + "/partitions", Integer.toString(n));
        assertHttpOk(r, "create partitioned topic " + topic);
    }

    static void assertSameTexts(List<String> want, List<? extends Message<?>> got) {
        assertEquals(want, texts(got));
    }
}
