// A producer for bench/failover.py --client java: sends synchronously to one topic and prints a
// line per outcome ("ready" once the producer exists, "a" per acknowledged send, "e <error>" per
// failed one) until its standard input closes. Run in source-file mode with the official Java
// client on the classpath:  java -cp <classpath> AckingProducer.java <service-url> <topic>
import java.io.InputStream;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;

public class AckingProducer {
    public static void main(String[] args) throws Exception {
        AtomicBoolean stop = new AtomicBoolean();
        Thread watcher = new Thread(() -> {
            try {
                InputStream in = System.in;
                while (in.read() >= 0) {
                    // Anything read is ignored: the end of the input is the signal.
                }
            } catch (Exception ignored) {
                // A broken pipe ends the run as well.
            }
            stop.set(true);
        });
        watcher.setDaemon(true);
        watcher.start();
        try (PulsarClient client = PulsarClient.builder().serviceUrl(args[0])
                .operationTimeout(30, TimeUnit.SECONDS).build();
             Producer<byte[]> producer = client.newProducer().topic(args[1])
                .enableBatching(false).sendTimeout(30, TimeUnit.SECONDS).create()) {
            System.out.println("ready");
            System.out.flush();
            byte[] payload = {'x'};
            while (!stop.get()) {
                try {
                    producer.send(payload);
                    System.out.println("a");
                } catch (Exception e) {
                    System.out.println("e " + e.toString().replace('\n', ' '));
                }
                System.out.flush();
            }
        }
    }
}
