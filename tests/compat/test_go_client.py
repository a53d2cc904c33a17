"""The official Go client (pulsar-client-go) against the broker: runs `go test ./...` in tests/go
with the fixture's broker URLs. Covers paths the Python client does not: retry topics
(ReconsumeLater) and their dead-letter topic, chunking from Go, nack redelivery delay, seek by
time, inclusive readers, GetLastMessageIDs / HasNext, batch-index acks, producer access modes
(Exclusive, WaitForExclusive), admin topic create / delete, namespace and topic policies
through the pulsaradmin package, the Failover EventListener, lookups
over an HTTP service URL, unloads under load (see tests/go/*_test.go). Tests behind the `restartphases` build tag are
left out here: test_go_restart_phases.py runs them around a broker restart.

MAGNETAR_EXPECT_DELAYED=1 is passed through: it makes the retry test assert the delay too."""

import os
import re
import shutil
import subprocess

import pytest

GO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "go")
GO_TEST_TIMEOUT_S = 300  # go test's own limit, for the test run itself (about 12 s)
# A cold run also downloads the modules and compiles the client: about 1.5 min of CPU on 2 cores,
# measured 4 min on a loaded machine; warm, the whole run takes about 14 s.
BUILD_AND_RUN_TIMEOUT_S = 900


@pytest.mark.skipif(shutil.which("go") is None, reason="the Go toolchain (`go`) is not on PATH")
@pytest.mark.timeout(BUILD_AND_RUN_TIMEOUT_S + 60)  # overrides the suite's per-test --timeout
def test_go_client(server):
    env = dict(os.environ,
               MAGNETAR_TEST_SERVICE_URL=server.service_url,
               MAGNETAR_TEST_WEB_URL=server.web_url,
               GOFLAGS=(os.environ.get("GOFLAGS", "") + " -mod=readonly").strip())
    cmd = ["go", "test", "-count=1", "-v", "-timeout", "%ds" % GO_TEST_TIMEOUT_S, "./..."]
    try:
        proc = subprocess.run(cmd, cwd=GO_DIR, env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=BUILD_AND_RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode("utf-8", "replace")
        pytest.fail("go test did not finish within %d s\n%s" % (BUILD_AND_RUN_TIMEOUT_S, out[-20000:]))
    out = proc.stdout.decode("utf-8", "replace")
    failed = re.findall(r"^\s*--- FAIL: (\S+)", out, re.M)
    passed = re.findall(r"^\s*--- PASS: (\S+)", out, re.M)
    skipped = re.findall(r"^\s*--- SKIP: (\S+)", out, re.M)
    assert proc.returncode == 0, "go test failed (exit %d), failing: %s\n%s" % (
        proc.returncode, failed, out[-20000:])
    # The broker URLs are set, so nothing may skip, and an empty run is a failure too.
    assert passed and not skipped, "go test ran %d tests, skipped %s\n%s" % (len(passed), skipped, out)
    print("go test: %d passed\n%s" % (len(passed), "\n".join(re.findall(r"^ok\s.*$", out, re.M))))
