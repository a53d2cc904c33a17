"""Runs the JUnit tests of tests/java with Maven (`mvn test`): the whole suite against the
standalone (test_java_client.py), or selected tests against servers a pytest file set up
(test_replicated.py). Maven's artifacts go to tests/java/.m2 (git-ignored)."""

import glob
import os
import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest

JAVA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "java")
REPORTS_DIR = os.path.join(JAVA_DIR, "target", "surefire-reports")
# A cold run downloads pulsar-client, JUnit and Maven's plugins (about 60 MB) and compiles the
# tests: measured 1.5 minutes; warm, the whole run takes about 1 minute (test time about 45 s).
# Every JUnit test has its own timeout (30 s unless it says more), so a hang fails one test.
BUILD_AND_RUN_TIMEOUT_S = 600


def _surefire_results():
    """[(test id, outcome, message)] from the surefire XML reports; outcome in
    passed / failed / error / skipped."""
    results = []
    for path in sorted(glob.glob(os.path.join(REPORTS_DIR, "TEST-*.xml"))):
        try:
            root = ET.parse(path).getroot()
        except ET.ParseError as e:
            results.append((os.path.basename(path), "error", "unreadable report: %s" % e))
            continue
        for case in root.iter("testcase"):
            name = "%s.%s" % (case.get("classname", "?").rsplit(".", 1)[-1], case.get("name", "?"))
            outcome, message = "passed", ""
            for tag in ("failure", "error", "skipped"):
                el = case.find(tag)
                if el is not None:
                    outcome = {"failure": "failed"}.get(tag, tag)
                    message = (el.get("message") or el.text or "").strip()
                    break
            results.append((name, outcome, message))
    return results


needs_java = pytest.mark.skipif(shutil.which("mvn") is None or shutil.which("java") is None,
                                reason="Maven (`mvn`) and a JDK (`java`, 17+) are needed on PATH")


def run_java_tests(env, selected=None):
    """Runs `mvn test` in tests/java with `env` added (the broker URLs and whatever the tests
    read), `selected` in surefire's -Dtest syntax; every selected test must run and pass.
    Returns the names of the tests that passed."""
    env = dict(os.environ, **env)
    cmd = ["mvn", "-B", "-ntp", "-Dstyle.color=never",
           "-Dmaven.repo.local=" + os.path.join(JAVA_DIR, ".m2"), "test"]
    if selected:
        cmd.append("-Dtest=" + selected)
    shutil.rmtree(REPORTS_DIR, ignore_errors=True)  # no stale results from an earlier run
    try:
        proc = subprocess.run(cmd, cwd=JAVA_DIR, env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=BUILD_AND_RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode("utf-8", "replace")
        pytest.fail("mvn test did not finish within %d s\n%s" % (BUILD_AND_RUN_TIMEOUT_S, out[-20000:]))
    out = proc.stdout.decode("utf-8", "replace")
    results = _surefire_results()
    bad = [r for r in results if r[1] in ("failed", "error")]
    skipped = [r[0] for r in results if r[1] == "skipped"]
    passed = [r[0] for r in results if r[1] == "passed"]
    summary = "\n".join("  %s %s: %s" % (outcome.upper(), name, message[:500])
                        for name, outcome, message in bad)
    assert proc.returncode == 0 and not bad, "mvn test failed (exit %d), %d failing:\n%s\n\n%s" % (
        proc.returncode, len(bad), summary, out[-20000:])
    # The broker URLs are set, so nothing may skip, and an empty run is a failure too.
    assert passed and not skipped, "mvn test ran %d tests, skipped %s\n%s" % (
        len(passed), skipped, out[-20000:])
    return passed
