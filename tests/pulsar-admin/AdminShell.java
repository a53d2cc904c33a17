// Runs Apache's pulsar-admin commands one after another in one JVM, for the compatibility tests
// (tests/compat/pulsar_admin.py): each command is PulsarAdminTool.execute(args), the CLI's own
// entry point behind `main` (as Pulsar's own CLI tests drive it), with System.exit turned off,
// its stdout and stderr captured and its exit code read back. A JVM per command costs about
// 1.3 s of start-up on the CI machine, and the suite runs about 160 commands.
//
// Protocol, over this process's stdin and stdout (System.out and System.err are the command's):
//   request:  one line, the command's arguments each base64-encoded, separated by spaces
//   response: "<exit code> <stdout bytes> <stderr bytes>\n", then those bytes
// End of input ends the process.

import java.io.BufferedReader;
import java.io.ByteArrayOutputStream;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.PrintStream;
import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.util.Base64;

public class AdminShell {
    public static void main(String[] unused) throws Exception {
        // The protocol's own stream; anything printed between commands goes to stderr.
        OutputStream protocol = new FileOutputStream(FileDescriptor.out);
        PrintStream idle = new PrintStream(new FileOutputStream(FileDescriptor.err), true);
        System.setOut(idle);

        Class<?> tool = Class.forName("org.apache.pulsar.admin.cli.PulsarAdminTool");
        Method setAllowSystemExit = hidden(tool, "setAllowSystemExit", boolean.class);
        Method resetLastExitCode = hidden(tool, "resetLastExitCode");
        Method getLastExitCode = hidden(tool, "getLastExitCode");
        Method execute = tool.getMethod("execute", String[].class);
        Method getSupplier = tool.getMethod("getPulsarAdminSupplier");
        setAllowSystemExit.invoke(null, false);

        BufferedReader requests =
                new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = requests.readLine()) != null) {
            String[] words = line.isEmpty() ? new String[0] : line.split(" ");
            String[] args = new String[words.length];
            for (int i = 0; i < words.length; i++) {
                args[i] = new String(Base64.getDecoder().decode(words[i]), StandardCharsets.UTF_8);
            }
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            ByteArrayOutputStream err = new ByteArrayOutputStream();
            PrintStream stdout = new PrintStream(out, true, StandardCharsets.UTF_8);
            PrintStream stderr = new PrintStream(err, true, StandardCharsets.UTF_8);
            PrintStream realErr = System.err;
            System.setOut(stdout);
            System.setErr(stderr);
            int code;
            try {
                resetLastExitCode.invoke(null);
                Object instance = execute.invoke(null, (Object) args);
                code = (Integer) getLastExitCode.invoke(null);
                closeAdmin(instance, getSupplier);
            } catch (java.lang.reflect.InvocationTargetException e) {
                e.getCause().printStackTrace(stderr); // what the CLI's JVM would have died of
                code = 1;
            } finally {
                System.setOut(idle);
                System.setErr(realErr);
            }
            stdout.flush();
            stderr.flush();
            byte[] outBytes = withoutExitNotice(out.toByteArray());
            byte[] errBytes = err.toByteArray();
            String header = code + " " + outBytes.length + " " + errBytes.length + "\n";
            protocol.write(header.getBytes(StandardCharsets.UTF_8));
            protocol.write(outBytes);
            protocol.write(errBytes);
            protocol.flush();
        }
    }

    private static Method hidden(Class<?> type, String name, Class<?>... params) throws Exception {
        Method method = type.getDeclaredMethod(name, params);
        method.setAccessible(true);
        return method;
    }

    // A process per command never closes its admin client; here it would leak its threads.
    private static void closeAdmin(Object tool, Method getSupplier) throws Exception {
        if (tool == null) {
            return;
        }
        Object supplier = getSupplier.invoke(tool);
        if (supplier == null) {
            return;
        }
        Field admin = supplier.getClass().getDeclaredField("admin");
        admin.setAccessible(true);
        Object client = admin.get(supplier);
        if (client instanceof AutoCloseable closeable) {
            closeable.close();
        }
    }

    // With System.exit off, the tool prints "Exit code is N (...)" as its last line.
    private static byte[] withoutExitNotice(byte[] out) {
        String text = new String(out, StandardCharsets.UTF_8);
        int at = text.lastIndexOf("Exit code is ");
        if (at >= 0 && (at == 0 || text.charAt(at - 1) == '\n')) {
            text = text.substring(0, at);
        }
        return text.getBytes(StandardCharsets.UTF_8);
    }
}
