"""The official Go client with a token against a broker with authentication on: runs the
`authtoken`-tagged test of tests/go (TestTokenAuthentication) with a good token and an expired
one made here: HS256 over plain TCP, and RS256 over `pulsar+ssl://` (hostname verified)."""

import os
import re
import shutil
import subprocess
import tempfile

import pytest

import conftest
from auth_util import Keys, bearer, expired_hs
from test_tls import tls_server
from tls_certs import Certs

GO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "go")
GO_TEST_TIMEOUT_S = 300
BUILD_AND_RUN_TIMEOUT_S = 900  # a cold run compiles the client (see test_go_client.py)


def _run_go_token_test(service_url, web_url, token, bad_token, ca=None):
    env = dict(os.environ,
               MAGNETAR_TEST_SERVICE_URL=service_url,
               MAGNETAR_TEST_WEB_URL=web_url,
               MAGNETAR_TEST_TOKEN=token,
               MAGNETAR_TEST_BAD_TOKEN=bad_token,
               GOFLAGS=(os.environ.get("GOFLAGS", "") + " -mod=readonly").strip())
    if ca:
        env["MAGNETAR_TEST_TLS_CA"] = ca
    cmd = ["go", "test", "-count=1", "-v", "-tags", "authtoken",
           "-timeout", "%ds" % GO_TEST_TIMEOUT_S, "-run", "^TestTokenAuthentication$", "."]
    proc = subprocess.run(cmd, cwd=GO_DIR, env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=BUILD_AND_RUN_TIMEOUT_S)
    out = proc.stdout.decode("utf-8", "replace")
    assert proc.returncode == 0, "go test failed (exit %d)\n%s" % (proc.returncode, out[-20000:])
    assert re.search(r"^--- PASS: TestTokenAuthentication\b", out, re.M), out


SKIP_NO_GO = pytest.mark.skipif(shutil.which("go") is None,
                                reason="the Go toolchain (`go`) is not on PATH")
SKIP_EXTERNAL = pytest.mark.skipif(
    bool(os.environ.get("MAGNETAR_TEST_SERVICE_URL") or os.environ.get("MAGNETAR_TEST_SERVER_CMD")),
    reason="starts a broker of its own with authentication on")


@SKIP_NO_GO
@SKIP_EXTERNAL
@pytest.mark.timeout(BUILD_AND_RUN_TIMEOUT_S + 120)
def test_go_client_with_a_token():
    with tempfile.TemporaryDirectory(prefix="magnetar-go-auth-") as directory:
        keys = Keys(directory)
        with conftest.private_server(keys.secret_toml(),
                                     health_headers=bearer(keys.hs_token("admin"))) as srv:
            _run_go_token_test(srv.service_url, srv.web_url, keys.hs_token("go-user", "1h"),
                               expired_hs(keys.secret, "go-user"))
            log = srv.log_tail(400)
            assert "token expired" in log and "panicked" not in log


@SKIP_NO_GO
@SKIP_EXTERNAL
@pytest.mark.timeout(BUILD_AND_RUN_TIMEOUT_S + 120)
def test_go_client_with_an_rs256_token_over_tls():
    with tempfile.TemporaryDirectory(prefix="magnetar-go-auth-tls-") as directory:
        keys = Keys(directory)
        certs = Certs(os.path.join(directory, "certs"))
        ca = certs.ca("test-ca")
        server_cert = certs.leaf(ca, "localhost")
        with tls_server(server_cert, plain=False, extra_toml=keys.public_toml()) as srv:
            # A token signed with a key the broker does not know is the refused one here.
            os.makedirs(os.path.join(directory, "other"))
            other = Keys(os.path.join(directory, "other"))
            _run_go_token_test(srv.tls_service_url, srv.tls_web_url,
                               keys.rs_token("go-user", "1h"), other.rs_token("go-user", "1h"),
                               ca=ca["cert"])
            log = srv.log_tail(400)
            assert "panicked" not in log
