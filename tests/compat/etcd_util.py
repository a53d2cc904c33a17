"""A throw-away etcd on loopback for the cluster-mode tests (data on /dev/shm when it exists).

`etcd_binary()` finds etcd (MAGNETAR_ETCD_BIN, else `etcd` on PATH). Without it the tests are
skipped, unless MAGNETAR_REQUIRE_ETCD=1 (scripts/test.sh sets it), which makes them fail.
Only the etcd process started here is ever signalled, by its PID."""

import os
import shutil
import subprocess
import tempfile
import time

import pytest

from compat_util import free_port, http_request

READY_TIMEOUT_S = 30


def etcd_binary():
    """The etcd binary; skips (or fails, with MAGNETAR_REQUIRE_ETCD=1) when there is none."""
    path = os.environ.get("MAGNETAR_ETCD_BIN") or shutil.which("etcd")
    if path and os.access(path, os.X_OK):
        return path
    if os.environ.get("MAGNETAR_REQUIRE_ETCD") == "1":
        pytest.fail("MAGNETAR_REQUIRE_ETCD=1 but no etcd binary was found "
                    "(apt-get install etcd-server, or set MAGNETAR_ETCD_BIN)")
    pytest.skip("etcd is not installed (apt-get install etcd-server); "
                "set MAGNETAR_REQUIRE_ETCD=1 to fail instead")


def scratch_dir(prefix):
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return tempfile.mkdtemp(prefix=prefix, dir=base)


class Etcd:
    """One etcd member on free loopback ports."""

    def __init__(self):
        self.binary = etcd_binary()
        self.dir = scratch_dir("magnetar-compat-etcd-")
        self.client_port = free_port()
        self.peer_port = free_port()
        self.endpoint = "http://127.0.0.1:%d" % self.client_port
        self.url = "etcd://127.0.0.1:%d" % self.client_port
        self.proc = None

    def start(self):
        peer = "http://127.0.0.1:%d" % self.peer_port
        cmd = [self.binary, "--name", "m0", "--data-dir", os.path.join(self.dir, "data"),
               "--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint,
               "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
               "--initial-cluster", "m0=" + peer]
        if shutil.which("setpriv"):  # dies with this pytest process
            cmd = ["setpriv", "--pdeathsig", "KILL", "--"] + cmd
        self.log = open(os.path.join(self.dir, "etcd.log"), "wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + READY_TIMEOUT_S
        last = "nothing tried"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("etcd exited with %s: %s" % (self.proc.returncode, self.log_tail()))
            try:
                status, body = http_request("GET", self.endpoint + "/health", timeout=2)
                if status == 200 and b"true" in body:
                    return self
                last = "%s %r" % (status, body[:100])
            except OSError as e:
                last = repr(e)
            time.sleep(0.1)  # polling another process's start-up: no event to wait on
        raise RuntimeError("etcd not ready after %d s (%s): %s"
                           % (READY_TIMEOUT_S, last, self.log_tail()))

    def log_tail(self, chars=3000):
        try:
            with open(os.path.join(self.dir, "etcd.log"), "rb") as f:
                return f.read().decode("utf-8", "replace")[-chars:]
        except OSError:
            return "(no etcd log)"

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        if getattr(self, "log", None):
            self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
