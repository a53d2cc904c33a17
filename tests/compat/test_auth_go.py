"""The official Go client with a token against a broker with authentication on: runs the
`authtoken`-tagged test of tests/go (TestTokenAuthentication) with a good token and an expired
one made here."""

import os
import re
import shutil
import subprocess
import tempfile

import pytest

import conftest
from auth_util import Keys, bearer, expired_hs

GO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "go")
GO_TEST_TIMEOUT_S = 300
BUILD_AND_RUN_TIMEOUT_S = 900  # a cold run compiles the client (see test_go_client.py)


@pytest.mark.skipif(shutil.which("go") is None, reason="the Go toolchain (`go`) is not on PATH")
@pytest.mark.skipif(
    bool(os.environ.get("MAGNETAR_TEST_SERVICE_URL") or os.environ.get("MAGNETAR_TEST_SERVER_CMD")),
    reason="starts a broker of its own with authentication on")
@pytest.mark.timeout(BUILD_AND_RUN_TIMEOUT_S + 120)
def test_go_client_with_a_token():
    with tempfile.TemporaryDirectory(prefix="magnetar-go-auth-") as directory:
        keys = Keys(directory)
        with conftest.private_server(keys.secret_toml(),
                                     health_headers=bearer(keys.hs_token("admin"))) as srv:
            env = dict(os.environ,
                       MAGNETAR_TEST_SERVICE_URL=srv.service_url,
                       MAGNETAR_TEST_WEB_URL=srv.web_url,
                       MAGNETAR_TEST_TOKEN=keys.hs_token("go-user", "1h"),
                       MAGNETAR_TEST_BAD_TOKEN=expired_hs(keys.secret, "go-user"),
                       GOFLAGS=(os.environ.get("GOFLAGS", "") + " -mod=readonly").strip())
            cmd = ["go", "test", "-count=1", "-v", "-tags", "authtoken",
                   "-timeout", "%ds" % GO_TEST_TIMEOUT_S, "-run", "^TestTokenAuthentication$", "."]
            proc = subprocess.run(cmd, cwd=GO_DIR, env=env, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  timeout=BUILD_AND_RUN_TIMEOUT_S)
            out = proc.stdout.decode("utf-8", "replace")
            assert proc.returncode == 0, "go test failed (exit %d)\n%s" % (proc.returncode, out[-20000:])
            assert re.search(r"^--- PASS: TestTokenAuthentication\b", out, re.M), out
            log = srv.log_tail(400)
            assert "token expired" in log and "panicked" not in log
