"""Apache's own `pulsar-admin` (the Java CLI of org.apache.pulsar:pulsar-client-tools 4.0.8),
for tests that check the admin API the way operators drive it.

The first use resolves the CLI's classpath with Maven (tests/pulsar-admin/pom.xml; artifacts in
the git-ignored tests/pulsar-admin/.m2, about 15 s cold) and caches it in
tests/pulsar-admin/classpath.txt. Each command is one JVM. The first command also dumps the
classes it loaded into a class-data-sharing archive (tests/pulsar-admin/cds-*.jsa, keyed by the
classpath and the JDK); later commands map it instead of parsing those classes again: about
1.3 s a command instead of 1.85 s on the CI machine.

    from pulsar_admin import PulsarAdmin, pulsar_admin_available
    admin = PulsarAdmin(server.web_url)
    out = admin("namespaces", "get-retention", "public/default")          # stdout, exit 0 asserted
    res = admin.run("topics", "stats", "persistent://public/default/x")   # CompletedProcess
"""

import functools
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading

import pytest

CLI_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pulsar-admin")
CLASSPATH_FILE = os.path.join(CLI_DIR, "classpath.txt")
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
        if not os.path.exists(CLASSPATH_FILE):
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


class PulsarAdmin:
    """`pulsar-admin --admin-url WEB_URL ...` as a callable."""

    def __init__(self, web_url):
        self.web_url = web_url
        self._conf_dir = tempfile.mkdtemp(prefix="pulsar-admin-conf-")
        self.conf = os.path.join(self._conf_dir, "client.conf")
        with open(self.conf, "w") as f:
            f.write("webServiceUrl=%s\n" % web_url)

    def run(self, *args, timeout=COMMAND_TIMEOUT_S):
        """Runs one command; returns the CompletedProcess (text stdout/stderr), whatever its exit."""
        return _run_java([self.conf, "--admin-url", self.web_url] + [str(a) for a in args],
                         timeout)

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
