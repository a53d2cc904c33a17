"""Apache's own `pulsar-admin` (the Java CLI of org.apache.pulsar:pulsar-client-tools 4.0.8),
for tests that check the admin API the way operators drive it.

The first use resolves the CLI's classpath with Maven (tests/pulsar-admin/pom.xml; artifacts in
the git-ignored tests/pulsar-admin/.m2, about 15 s cold) and caches it in
tests/pulsar-admin/classpath.txt. Commands run in one JVM per `PulsarAdmin`
(tests/pulsar-admin/AdminShell.java): each is the CLI's own `PulsarAdminTool.execute(args)`, the
code behind its `main`, with System.exit off and stdout, stderr and the exit code captured;
about 0.2-0.4 s a command instead of 1.3 s for a JVM each (the suite runs about 160).
MAGNETAR_PULSAR_ADMIN_JVM_PER_COMMAND=1 runs each command as its own `pulsar-admin` process
instead, as an operator's shell does; the first also dumps the classes it loaded into a
class-data-sharing archive (tests/pulsar-admin/cds-*.jsa, keyed by the classpath and the JDK)
that later ones map (1.3 s a command instead of 1.85 s on the CI machine).

    from pulsar_admin import PulsarAdmin, pulsar_admin_available
    admin = PulsarAdmin(server.web_url)
    out = admin("namespaces", "get-retention", "public/default")          # stdout, exit 0 asserted
    res = admin.run("topics", "stats", "persistent://public/default/x")   # CompletedProcess
"""

import atexit
import base64
import functools
import hashlib
import json
import os
import select
import shutil
import subprocess
import tempfile
import threading
import time

import pytest

CLI_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pulsar-admin")
CLASSPATH_FILE = os.path.join(CLI_DIR, "classpath.txt")
SHELL_SOURCE = os.path.join(CLI_DIR, "AdminShell.java")
JVM_PER_COMMAND = os.environ.get("MAGNETAR_PULSAR_ADMIN_JVM_PER_COMMAND") == "1"
MAIN_CLASS = "org.apache.pulsar.admin.cli.PulsarAdminTool"
RESOLVE_TIMEOUT_S = 600
COMMAND_TIMEOUT_S = 60
# A short-lived CLI: the C1 compiler alone and the serial GC about halve each command's CPU time.
JVM_FLAGS = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xshare:auto",
             # JVM warnings (a refused archive, say) to stderr: stdout is the command's output.
             "-Xlog:disable", "-Xlog:all=warning:stderr"]

_lock = threading.Lock()
_cds_lock = threading.Lock()


def pulsar_admin_available():
    return shutil.which("mvn") is not None and shutil.which("java") is not None


requires_pulsar_admin = pytest.mark.skipif(
    not pulsar_admin_available(), reason="Maven (`mvn`) and a JDK (`java`) are needed on PATH")


def classpath():
    """The CLI's classpath, resolved once (by Maven) and cached."""
    with _lock:
        pom = os.path.join(CLI_DIR, "pom.xml")
        if not os.path.exists(CLASSPATH_FILE) or \
                os.path.getmtime(CLASSPATH_FILE) < os.path.getmtime(pom):
            cmd = ["mvn", "-B", "-ntp", "-q", "-Dstyle.color=never",
                   "-Dmaven.repo.local=" + os.path.join(CLI_DIR, ".m2"),
                   "dependency:build-classpath", "-Dmdep.outputFile=" + CLASSPATH_FILE + ".tmp"]
            proc = subprocess.run(cmd, cwd=CLI_DIR, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  timeout=RESOLVE_TIMEOUT_S)
            if proc.returncode != 0:
                raise RuntimeError("resolving pulsar-admin failed:\n" +
                                   proc.stdout.decode("utf-8", "replace")[-5000:])
            os.replace(CLASSPATH_FILE + ".tmp", CLASSPATH_FILE)
        with open(CLASSPATH_FILE) as f:
            return f.read().strip()


def _java_version():
    res = subprocess.run(["java", "-version"], stdin=subprocess.DEVNULL, capture_output=True,
                         text=True, timeout=COMMAND_TIMEOUT_S)
    return res.stderr


@functools.lru_cache(maxsize=None)
def _cds_archive(cp):
    """The archive's path for this classpath and JDK (an archive from another JDK is refused)."""
    key = hashlib.sha256((cp + "\n" + _java_version()).encode()).hexdigest()[:16]
    return os.path.join(CLI_DIR, "cds-%s.jsa" % key)


def _run_java(args, timeout):
    """Runs the CLI with the shared archive; the first run (under the lock) dumps it."""
    cp = classpath()
    archive = _cds_archive(cp)

    def run(archive_flag):
        return subprocess.run(["java"] + JVM_FLAGS + [archive_flag, "-cp", cp, MAIN_CLASS] + args,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout)

    with _cds_lock:
        if not os.path.exists(archive):
            # Dumped beside, then renamed: a run cut short leaves no half-written archive.
            tmp = "%s.%d.tmp" % (archive, os.getpid())
            res = run("-XX:ArchiveClassesAtExit=" + tmp)
            if os.path.exists(tmp):
                os.replace(tmp, archive)
            return res
    return run("-XX:SharedArchiveFile=" + archive)


class _Shell:
    """One JVM running AdminShell: commands in, (exit code, stdout, stderr) out, one at a time.
    A command that overruns its timeout kills the JVM (the next command starts another)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._proc = None
        self._buffer = b""
        atexit.register(self.close)

    def run(self, args, timeout):
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._start()
            line = " ".join(base64.b64encode(a.encode()).decode() for a in args) + "\n"
            deadline = time.monotonic() + timeout
            try:
                self._proc.stdin.write(line.encode())
                self._proc.stdin.flush()
                code, out_len, err_len = map(int, self._read_until(b"\n", deadline).split())
                out = self._read_exactly(out_len, deadline).decode("utf-8", "replace")
                err = self._read_exactly(err_len, deadline).decode("utf-8", "replace")
            except (subprocess.TimeoutExpired, OSError, ValueError):
                self._kill()
                raise
            return subprocess.CompletedProcess(["pulsar-admin"] + args[1:], code, out, err)

    def _start(self):
        cmd = ["java"] + JVM_FLAGS + ["-cp", classpath(), SHELL_SOURCE]
        # stderr inherited: what the JVM says between commands shows in the test's output.
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._buffer = b""

    def _fill(self, deadline):
        left = deadline - time.monotonic()
        ready, _, _ = select.select([self._proc.stdout], [], [], max(left, 0))
        if not ready:
            raise subprocess.TimeoutExpired("pulsar-admin shell", COMMAND_TIMEOUT_S)
        chunk = os.read(self._proc.stdout.fileno(), 1 << 16)
        if not chunk:
            raise OSError("the pulsar-admin shell ended (exit %s)" % self._proc.wait(timeout=10))
        self._buffer += chunk

    def _read_until(self, end, deadline):
        while end not in self._buffer:
            self._fill(deadline)
        line, self._buffer = self._buffer.split(end, 1)
        return line.decode()

    def _read_exactly(self, n, deadline):
        while len(self._buffer) < n:
            self._fill(deadline)
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    def _kill(self):
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()  # our own child, by its PID
            self._proc.wait(timeout=10)
        self._proc = None

    def close(self):
        """Ends the JVM: end of input, then a bounded wait."""
        if self._proc is None:
            return
        try:
            self._proc.stdin.close()
            self._proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self._kill()
        self._proc = None


class PulsarAdmin:
    """`pulsar-admin --admin-url WEB_URL ...` as a callable."""

    def __init__(self, web_url):
        self.web_url = web_url
        self._conf_dir = tempfile.mkdtemp(prefix="pulsar-admin-conf-")
        self.conf = os.path.join(self._conf_dir, "client.conf")
        with open(self.conf, "w") as f:
            f.write("webServiceUrl=%s\n" % web_url)
        self._shell = None if JVM_PER_COMMAND else _Shell()

    def run(self, *args, timeout=COMMAND_TIMEOUT_S):
        """Runs one command; returns the CompletedProcess (text stdout/stderr), whatever its exit."""
        full = [self.conf, "--admin-url", self.web_url] + [str(a) for a in args]
        if self._shell is None:
            return _run_java(full, timeout)
        return self._shell.run(full, timeout)

    def run_process(self, *args, timeout=COMMAND_TIMEOUT_S):
        """Runs one command as its own `pulsar-admin` process (its `main`, System.exit and all)."""
        full = [self.conf, "--admin-url", self.web_url] + [str(a) for a in args]
        return _run_java(full, timeout)

    def __call__(self, *args, timeout=COMMAND_TIMEOUT_S):
        """Runs one command, asserts exit 0 and returns its stdout."""
        res = self.run(*args, timeout=timeout)
        assert res.returncode == 0, "pulsar-admin %s: exit %d\nstdout: %s\nstderr: %s" % (
            " ".join(map(str, args)), res.returncode, res.stdout[-3000:], res.stderr[-3000:])
        return res.stdout

    def json(self, *args, timeout=COMMAND_TIMEOUT_S):
        """Runs one command whose stdout is JSON and parses it."""
        return json.loads(self(*args, timeout=timeout))

    def fails(self, *args, timeout=COMMAND_TIMEOUT_S):
        """Runs one command that must fail; returns stdout+stderr (the reason is in there)."""
        res = self.run(*args, timeout=timeout)
        assert res.returncode != 0, "pulsar-admin %s should have failed:\n%s" % (
            " ".join(map(str, args)), res.stdout[-3000:])
        return res.stdout + res.stderr
