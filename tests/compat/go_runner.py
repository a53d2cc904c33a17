"""Runs one Go test of tests/go behind a build tag (tests that need servers set up by a pytest
file: a restart in the middle, TLS brokers, a replicated cluster; the tag keeps them out of the
plain `go test ./...` of test_go_client.py). The test must run and pass, not skip."""

import os
import re
import shutil
import subprocess

import pytest

GO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "go")
GO_TEST_TIMEOUT_S = 180
# A cold run downloads the modules and compiles the client (see test_go_client.py).
BUILD_AND_RUN_TIMEOUT_S = 900

needs_go = pytest.mark.skipif(shutil.which("go") is None,
                              reason="the Go toolchain (`go`) is not on PATH")


def run_go_test(tag, test_name, env):
    env = dict(os.environ, GOFLAGS=(os.environ.get("GOFLAGS", "") + " -mod=readonly").strip(),
               **env)
    cmd = ["go", "test", "-count=1", "-v", "-tags", tag, "-timeout", "%ds" % GO_TEST_TIMEOUT_S,
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
    assert not re.search(r"^\s*--- SKIP:", out, re.M), "go test %s skipped\n%s" % (test_name, out)
    return out
