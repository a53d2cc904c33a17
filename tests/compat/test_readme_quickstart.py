"""The README's quick start, as a newcomer types it.

Reads the first command of README.md's "Quick start" block (the one that runs the server), runs it
exactly as written in a clean directory inside the workspace (so `cargo` finds the workspace and
`./data` lands in that directory), waits for the server, produces and consumes a few messages with
the official Python client on the ports the README promises, and stops it. When 6650 or 8080 is
already taken on this machine, the test appends port options to the command (and changes nothing
else). If the README's command changes, this test follows it; if it fails, this test fails with
its output.

It also checks that logs written to a file carry no terminal colour codes."""

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

from compat_util import free_port as _free_port, http_request, produce_and_consume

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
README = os.path.join(REPO_ROOT, "README.md")
README_BROKER_PORT = 6650
README_WEB_PORT = 8080
# `cargo run` may have to compile first when the test runs alone (test.sh builds the binary
# before pytest, so there it only checks that everything is fresh).
START_TIMEOUT_S = 900
STOP_TIMEOUT_S = 60


def quick_start_commands():
    """The commands of the first code block under '## Quick start', comments stripped."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    section = re.search(r"^## Quick start\s*$(.*?)(?=^## )", text, re.M | re.S)
    assert section, "README.md has no '## Quick start' section"
    block = re.search(r"^```[a-z]*\n(.*?)^```", section.group(1), re.M | re.S)
    assert block, "README.md's quick start has no code block"
    commands = []
    for line in block.group(1).splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line and not line.startswith("#"):
            commands.append(line)
    return commands


def _port_free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _tail(path, chars=6000):
    with open(path, "rb") as f:
        data = f.read().decode("utf-8", "replace")
    return data[-chars:]


def test_quick_start_has_exactly_two_commands_and_ci_runs_the_second():
    commands = quick_start_commands()
    assert len(commands) == 2, "the quick start must give exactly two commands: %r" % commands
    with open(os.path.join(REPO_ROOT, ".ci", "run"), encoding="utf-8") as f:
        ci = f.read()
    assert commands[1] in ci, ".ci/run must run the README's test command %r" % commands[1]


@pytest.mark.timeout(START_TIMEOUT_S + 180)
def test_readme_first_command_runs_the_server():
    command = quick_start_commands()[0]
    argv = shlex.split(command)
    if _port_free(README_BROKER_PORT) and _port_free(README_WEB_PORT):
        broker_port, web_port = README_BROKER_PORT, README_WEB_PORT
    else:  # somebody else's server holds the README's ports: append ours, change nothing else
        broker_port, web_port = _free_port(), _free_port()
        argv += ["--broker-port", str(broker_port), "--web-port", str(web_port)]

    os.makedirs(os.path.join(REPO_ROOT, "target"), exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="readme-quickstart-", dir=os.path.join(REPO_ROOT, "target"))
    log_path = os.path.join(workdir, "server.log")
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    prefix = ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(prefix + argv, cwd=workdir, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env)
    try:
        _wait_ready(proc, command, broker_port, web_port, log_path)
        produce_and_consume("pulsar://127.0.0.1:%d" % broker_port, 5, "quick-start")
        assert os.path.isdir(os.path.join(workdir, "data")), \
            "the server keeps no ./data in the directory it was started in"
        proc.send_signal(signal.SIGTERM)  # `cargo run` execs the binary: this PID is the server
        try:
            code = proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail("the server did not stop within %d s of SIGTERM\n%s"
                        % (STOP_TIMEOUT_S, _tail(log_path)))
        assert code == 0, "the server exited with %s after SIGTERM\n%s" % (code, _tail(log_path))
        with open(log_path, "rb") as f:
            log_bytes = f.read()
        assert b"INFO" in log_bytes, "the server wrote no log lines\n%s" % _tail(log_path)
        assert b"\x1b[" not in log_bytes, \
            "logs written to a file carry terminal colour codes:\n%r" % log_bytes[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    shutil.rmtree(workdir, ignore_errors=True)


def _wait_ready(proc, command, broker_port, web_port, log_path):
    deadline = time.monotonic() + START_TIMEOUT_S
    last = "nothing tried yet"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail("the README's first command `%s` exited with code %s:\n%s"
                        % (command, proc.returncode, _tail(log_path)))
        try:
            with socket.create_connection(("127.0.0.1", broker_port), timeout=1):
                pass
            status, body = http_request(
                "GET", "http://127.0.0.1:%d/admin/v2/brokers/health" % web_port, timeout=2)
            if status == 200:
                return
            last = "health answered %s %r" % (status, body[:200])
        except OSError as e:
            last = repr(e)
        time.sleep(0.2)  # polling process start-up (and maybe a build): there is no event to await
    pytest.fail("`%s` not ready after %d s (last: %s)\n%s"
                % (command, START_TIMEOUT_S, last, _tail(log_path)))
