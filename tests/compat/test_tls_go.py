"""The official Go client over TLS: tests/go/tls_test.go (build tag `tls`, left out of the plain
`go test ./...` of test_go_client.py) run against brokers this file starts with `[tls]` and
certificates made here (see test_tls.py for the Python client)."""

import os
import re
import shutil
import subprocess
import tempfile

import pytest

from test_tls import tls_server
from tls_certs import Certs

GO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "go")
GO_TEST_TIMEOUT_S = 180
# A cold run downloads the modules and compiles the client (see test_go_client.py).
BUILD_AND_RUN_TIMEOUT_S = 900


@pytest.fixture(scope="module")
def certs():
    directory = tempfile.mkdtemp(prefix="magnetar-tls-go-certs-")
    try:
        c = Certs(directory)
        c.ca_main = c.ca("test-ca")
        yield c
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def run_go_tls(test_name, env):
    env = dict(os.environ, GOFLAGS=(os.environ.get("GOFLAGS", "") + " -mod=readonly").strip(),
               **env)
    cmd = ["go", "test", "-count=1", "-v", "-tags", "tls", "-timeout", "%ds" % GO_TEST_TIMEOUT_S,
           "-run", "^%s$" % test_name, "."]
    try:
        proc = subprocess.run(cmd, cwd=GO_DIR, env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=BUILD_AND_RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode("utf-8", "replace")
        pytest.fail("go test %s did not finish within %d s\n%s"
                    % (test_name, BUILD_AND_RUN_TIMEOUT_S, out[-20000:]))
    out = proc.stdout.decode("utf-8", "replace")
    assert proc.returncode == 0, "go test %s failed (exit %d)\n%s" % (
        test_name, proc.returncode, out[-20000:])
    assert re.search(r"^--- PASS: %s\b" % re.escape(test_name), out, re.M), \
        "go test %s did not run and pass\n%s" % (test_name, out)


needs_go = pytest.mark.skipif(shutil.which("go") is None,
                              reason="the Go toolchain (`go`) is not on PATH")


@needs_go
@pytest.mark.timeout(BUILD_AND_RUN_TIMEOUT_S + 120)
def test_go_client_cert_required(certs):
    server = certs.leaf(certs.ca_main, "localhost")
    client = certs.leaf(certs.ca_main, "go-client")
    ca = certs.ca_main["cert"]
    with tls_server(server, trust=ca, require=True) as srv:
        run_go_tls("TestTLSClientCertRequired", {
            "MAGNETAR_TEST_TLS_SERVICE_URL": srv.tls_service_url,
            "MAGNETAR_TEST_TLS_CA": ca,
            "MAGNETAR_TEST_TLS_CLIENT_CERT": client["cert"],
            "MAGNETAR_TEST_TLS_CLIENT_KEY": client["key"],
        })


@needs_go
@pytest.mark.timeout(BUILD_AND_RUN_TIMEOUT_S + 120)
def test_go_hostname_mismatch(certs):
    wrong = certs.leaf(certs.ca_main, "wrong.example", san="DNS:wrong.example")
    with tls_server(wrong) as srv:
        run_go_tls("TestTLSHostnameMismatch", {
            "MAGNETAR_TEST_TLS_SERVICE_URL": srv.tls_service_url,
            "MAGNETAR_TEST_TLS_CA": certs.ca_main["cert"],
        })
