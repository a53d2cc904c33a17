package magnetar.compat;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.Timestamp;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.PulsarClientException;
import org.apache.pulsar.client.api.Schema;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.client.api.schema.GenericRecord;
import org.junit.jupiter.api.Test;

/** JSON, Avro and Protobuf-native schemas; AUTO_CONSUME; compatibility; schema deletion. */
class SchemaTest extends PulsarTestBase {

    private static String schemaUrl(String topic) {
        return "/admin/v2/schemas/public/default/" + shortName(topic) + "/schema";
    }

    private static String jsonField(String json, String field) {
        Matcher m = Pattern.compile("\"" + field + "\"\\s*:\\s*(\"([^\"]*)\"|(-?\\d+))").matcher(json);
        return m.find() ? (m.group(2) != null ? m.group(2) : m.group(3)) : null;
    }

    private <T> void roundTrip(Schema<T> schema, String prefix, String wantType, T value) throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic(prefix);
        Consumer<T> cons = closeLater(c.newConsumer(schema).topic(topic).subscriptionName("s")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe());
        Producer<T> p = closeLater(c.newProducer(schema).topic(topic).enableBatching(false).create());
        p.send(value);
        Message<T> m = receive(cons);
        assertEquals(value, m.getValue());
        assertNotNull(m.getSchemaVersion(), "message without schema version");
        cons.acknowledge(m);

        HttpResult r = http("GET", schemaUrl(topic), null);
        assertHttpOk(r, "GET schema");
        assertEquals(wantType, jsonField(r.body(), "type"), "schema type in " + r.body());
        assertEquals("0", jsonField(r.body(), "version"), "schema version in " + r.body());
    }

    @Test
    void jsonSchemaRoundTrip() throws Exception {
        roundTrip(Schema.JSON(User.class), "schema-json", "JSON", new User("ann", 31));
    }

    @Test
    void avroSchemaRoundTrip() throws Exception {
        roundTrip(Schema.AVRO(User.class), "schema-avro", "AVRO", new User("bob", 42));
    }

    /** Protobuf-native with a well-known type that ships in protobuf-java. */
    @Test
    void protobufNativeSchemaRoundTrip() throws Exception {
        Timestamp ts = Timestamp.newBuilder().setSeconds(1_700_000_000L).setNanos(123).build();
        roundTrip(Schema.PROTOBUF_NATIVE(Timestamp.class), "schema-proto", "PROTOBUF_NATIVE", ts);
    }

    /** AUTO_CONSUME: the consumer fetches the topic's schema from the broker (GET_SCHEMA) and
     * decodes generic records. */
    @Test
    void autoConsumeDecodesWithFetchedSchema() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("schema-auto");
        Producer<User> p = closeLater(c.newProducer(Schema.AVRO(User.class)).topic(topic)
                .enableBatching(false).create());
        Consumer<GenericRecord> cons = closeLater(c.newConsumer(Schema.AUTO_CONSUME()).topic(topic)
                .subscriptionName("s").subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                .subscribe());
        p.send(new User("carl", 7));
        Message<GenericRecord> m = receive(cons);
        GenericRecord rec = m.getValue();
        assertEquals("carl", String.valueOf(rec.getField("name")));
        assertEquals("7", String.valueOf(rec.getField("age")));
    }

    /** The same schema from two producers is one schema version; a producer with a schema of
     * another type (AVRO, STRING on a JSON topic) is refused with IncompatibleSchemaException. */
    @Test
    void sameSchemaSameVersionOtherTypeRefused() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("schema-compat");
        Consumer<User> cons = closeLater(c.newConsumer(Schema.JSON(User.class)).topic(topic)
                .subscriptionName("s").subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                .subscribe());
        Producer<User> p1 = closeLater(c.newProducer(Schema.JSON(User.class)).topic(topic)
                .enableBatching(false).create());
        Producer<User> p2 = closeLater(c.newProducer(Schema.JSON(User.class)).topic(topic)
                .enableBatching(false).create());
        p1.send(new User("a", 1));
        p2.send(new User("b", 2));
        Message<User> m1 = receive(cons);
        Message<User> m2 = receive(cons);
        assertArrayEquals(m1.getSchemaVersion(), m2.getSchemaVersion(), "same schema, two versions");

        assertThrows(PulsarClientException.IncompatibleSchemaException.class,
                () -> closeLater(c.newProducer(Schema.AVRO(User.class)).topic(topic).create()));
        assertThrows(PulsarClientException.IncompatibleSchemaException.class,
                () -> closeLater(c.newProducer(Schema.STRING).topic(topic).create()));
    }

    /** After DELETE .../schema, Pulsar cannot return the deleted versions any more
     * (GET .../schema/0 answers 404, as GET .../schema does), and a new schema of another
     * type may start the history again. */
    @Test
    void deletedSchemaVersionIsNotFetchable() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("schema-del");
        try (Producer<User> p = c.newProducer(Schema.JSON(User.class)).topic(topic)
                .enableBatching(false).create()) {
            p.send(new User("x", 1));
        }
        HttpResult before = http("GET", schemaUrl(topic) + "/0", null);
        assertEquals(200, before.status(), "version 0 before the delete: " + before.body());

        HttpResult del = http("DELETE", schemaUrl(topic), null);
        assertHttpOk(del, "DELETE schema");
        HttpResult latest = http("GET", schemaUrl(topic), null);
        assertEquals(404, latest.status(), "latest schema after the delete: " + latest.body());
        HttpResult v0 = http("GET", schemaUrl(topic) + "/0", null);
        assertEquals(404, v0.status(), "deleted version 0 still fetchable: " + v0.body());

        // the history starts again: another type is accepted now
        Producer<String> p = closeLater(c.newProducer(Schema.STRING).topic(topic).create());
        p.send("text now");
        HttpResult now = http("GET", schemaUrl(topic), null);
        assertHttpOk(now, "GET schema after re-creation");
        assertEquals("STRING", jsonField(now.body(), "type"), now.body());
        assertTrue(now.body().contains("\"version\""), now.body());
    }

    /** Non-persistent topics register and check schemas as persistent ones do: the producer's
     * version rides on its messages, the registry shows it, another type is refused. */
    @Test
    void nonPersistentTopicsHaveSchemas() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("schema-np").replace("persistent://", "non-persistent://");
        Consumer<User> cons = closeLater(c.newConsumer(Schema.AVRO(User.class)).topic(topic)
                .subscriptionName("s").subscribe());
        Producer<User> p = closeLater(c.newProducer(Schema.AVRO(User.class)).topic(topic)
                .enableBatching(false).create());
        p.send(new User("np", 5));
        Message<User> m = receive(cons);
        assertEquals(new User("np", 5), m.getValue());
        assertArrayEquals(new byte[8], m.getSchemaVersion(), "version 0 on the message");
        HttpResult r = http("GET", schemaUrl(topic), null);
        assertHttpOk(r, "GET schema");
        assertEquals("AVRO", jsonField(r.body(), "type"), r.body());
        assertThrows(PulsarClientException.IncompatibleSchemaException.class,
                () -> c.newProducer(Schema.JSON(User.class)).topic(topic).create());
    }
}
