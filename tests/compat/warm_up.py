"""Builds ahead what the compat suite would otherwise build on its own clock, with the tests'
own helpers and caches: the Maven classpaths of pulsar-admin, `pulsar tokens` and the token
interop program, the Java client suite's artifacts and classes, and the Go client suite's modules
and packages (about 115 CPU-seconds on a cold Go cache). scripts/test.sh runs it in the
background at the lowest CPU priority while cargo builds and the Rust tests run, and waits for it
before pytest starts (the Java build must not run beside `mvn test` in the same directory).

Nothing depends on it: a step that fails is reported and the test that needs it builds it again
(and fails there, with its own message, if it still cannot)."""

import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
STEP_TIMEOUT_S = 900


def step(name, action):
    started = time.monotonic()
    try:
        action()
        outcome = "done"
    except Exception as error:  # reported, not fatal: the tests build it again
        outcome = "FAILED: %s" % str(error)[-2000:]
    print("warm-up: %s %s in %.0f s" % (name, outcome, time.monotonic() - started), flush=True)


def run(cmd, cwd):
    proc = subprocess.run(cmd, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=STEP_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError("exit %d: %s" % (proc.returncode, proc.stdout.decode("utf-8", "replace")))


def main():
    sys.path.insert(0, HERE)
    if shutil.which("mvn") and shutil.which("java"):
        import pulsar_admin
        import test_auth_interop
        step("pulsar-admin classpath", pulsar_admin.classpath)
        step("token interop classpath", test_auth_interop.classpath)
        step("pulsar tokens classpath",
             lambda: test_auth_interop.resolve(test_auth_interop.PULSAR_TOKENS_DIR))
        java = os.path.join(TESTS, "java")
        step("Java client suite (mvn test-compile)", lambda: run(
            ["mvn", "-B", "-ntp", "-q", "-Dstyle.color=never",
             "-Dmaven.repo.local=" + os.path.join(java, ".m2"), "test-compile"], java))
    if shutil.which("go"):
        env_flags = (os.environ.get("GOFLAGS", "") + " -mod=readonly").strip()
        os.environ["GOFLAGS"] = env_flags
        step("Go client suite (go test -run ^$)", lambda: run(
            ["go", "test", "-count=1", "-run", "^$", "./..."], os.path.join(TESTS, "go")))


if __name__ == "__main__":
    main()
