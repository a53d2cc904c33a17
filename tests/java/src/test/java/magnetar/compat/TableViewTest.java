package magnetar.compat;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.util.Map;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.Schema;
import org.apache.pulsar.client.api.TableView;
import org.junit.jupiter.api.Test;

/** TableView: the latest value per key, kept up to date. */
class TableViewTest extends PulsarTestBase {

    private static Map<String, String> snapshot(TableView<String> tv) {
        Map<String, String> m = new java.util.HashMap<>();
        tv.forEach(m::put);
        return m;
    }

    @Test
    void tableViewHoldsLatestValuePerKeyAndFollowsUpdates() throws Exception {
        PulsarClient c = client();
        String topic = uniqueTopic("tableview");
        Producer<String> p = closeLater(c.newProducer(Schema.STRING).topic(topic).enableBatching(false).create());
        p.newMessage().key("k1").value("v1").send();
        p.newMessage().key("k2").value("v2").send();
        p.newMessage().key("k1").value("v3").send();

        // create() returns once the view has read the topic up to its last message
        TableView<String> tv = closeLater(await(c.newTableView(Schema.STRING).topic(topic).createAsync(),
                OP_TIMEOUT_S, "create TableView"));
        assertEquals(Map.of("k1", "v3", "k2", "v2"), snapshot(tv));

        BlockingQueue<String> updates = new LinkedBlockingQueue<>();
        tv.listen((k, v) -> updates.add(k + "=" + v));
        p.newMessage().key("k3").value("v4").send();
        p.newMessage().key("k2").value("v5").send();
        assertEquals("k3=v4", updates.poll(RECEIVE_TIMEOUT_S, TimeUnit.SECONDS));
        assertEquals("k2=v5", updates.poll(RECEIVE_TIMEOUT_S, TimeUnit.SECONDS));
        assertEquals(Map.of("k1", "v3", "k2", "v5", "k3", "v4"), snapshot(tv));
    }
}
