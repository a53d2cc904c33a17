"""The README's cluster demo, as a newcomer types it.

Reads the first command of README.md's "Cluster mode (etcd)" code block, runs it exactly as
written from the repository root (appending port options only when the demo's default ports are
taken on this machine), waits (bounded) until it prints that the cluster is ready, produces and
consumes through every broker it started (each answers lookups of any topic with the topic's
owner), checks the brokers' registrations through the admin API, then presses Ctrl-C (SIGINT to
the script) and checks that the script stopped the etcd, storage node and broker processes it
started and removed their data.

Only the process group this test creates is ever killed (on failure), by its id. Skipped without
etcd unless MAGNETAR_REQUIRE_ETCD=1."""

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import threading
import time

import pytest

import conftest
from compat_util import http_request, produce_and_consume
from etcd_util import etcd_binary, free_port

README = os.path.join(conftest.REPO_ROOT, "README.md")
DEFAULT_PORTS = {"--etcd-port": 2379, "--broker-port": 6650, "--web-port": 8080,
                 "--storage-port": 3181}
STORAGE_NODES = 3  # the demo's default: ports --storage-port and the two after it
START_TIMEOUT_S = 120
STOP_TIMEOUT_S = 60


def cluster_demo_command():
    with open(README, encoding="utf-8") as f:
        text = f.read()
    section = re.search(r"^## Cluster mode \(etcd\)\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert section, "README.md has no '## Cluster mode (etcd)' section"
    block = re.search(r"^```[a-z]*\n(.*?)^```", section.group(1), re.M | re.S)
    assert block, "README.md's cluster section has no code block"
    for line in block.group(1).splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line and not line.startswith("#"):
            return line
    raise AssertionError("README.md's cluster code block has no command")


def _port_free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _pid_alive(pid):
    try:
        os.kill(pid, 0)  # signal 0: existence check only
    except ProcessLookupError:
        return False
    return True


@pytest.mark.timeout(START_TIMEOUT_S + STOP_TIMEOUT_S + 120)
def test_readme_cluster_demo_runs_and_stops_everything_it_started():
    if os.environ.get("MAGNETAR_TEST_SERVICE_URL") or os.environ.get("MAGNETAR_TEST_SERVER_CMD"):
        pytest.skip("runs magnetar itself; an external broker or server command is set")
    etcd_binary()  # skip or fail without etcd, as the other etcd tests
    command = cluster_demo_command()
    argv = shlex.split(command)
    ports = dict(DEFAULT_PORTS)
    brokers = int(argv[argv.index("--brokers") + 1]) if "--brokers" in argv else 1
    extra = [2380, 3182, 3183] + [6650 + i for i in range(1, brokers)] \
        + [8080 + i for i in range(1, brokers)]
    busy = [p for p in list(DEFAULT_PORTS.values()) + extra if not _port_free(p)]
    if busy:  # someone else holds a default port: append ours, change nothing else
        ports = {flag: free_port() for flag in DEFAULT_PORTS}
        while not _port_free(ports["--etcd-port"] + 1):
            ports["--etcd-port"] = free_port()
        while not all(_port_free(ports["--storage-port"] + i) for i in range(STORAGE_NODES)):
            ports["--storage-port"] = free_port()
        for flag in ("--broker-port", "--web-port"):
            while not all(_port_free(ports[flag] + i) for i in range(brokers)):
                ports[flag] = free_port()
        for flag, port in ports.items():
            argv += [flag, str(port)]
    broker_port, web_port = ports["--broker-port"], ports["--web-port"]

    lines = []
    ready = threading.Event()

    def _read(stream):
        for raw in stream:
            lines.append(raw.rstrip("\n"))
            if "cluster-demo: ready" in raw:
                ready.set()

    # SIGINT at its default in the script, as in a terminal (a shell started in the background
    # may have it ignored, and an ignored signal cannot be trapped).
    proc = subprocess.Popen(argv, cwd=conftest.REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                            start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    reader = threading.Thread(target=_read, args=(proc.stdout,), daemon=True)
    reader.start()
    output = lambda: "\n".join(lines[-60:])  # noqa: E731
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready.wait(0.2):
            if proc.poll() is not None:
                pytest.fail("`%s` exited with %s before it was ready:\n%s"
                            % (command, proc.returncode, output()))
            if time.monotonic() > deadline:
                pytest.fail("`%s` not ready after %d s:\n%s" % (command, START_TIMEOUT_S, output()))
        text = "\n".join(lines)
        etcd_pid = int(re.search(r"etcd pid (\d+)", text).group(1))
        broker_pids = [int(p) for p in re.findall(r"broker \d+ pid (\d+)", text)]
        assert len(broker_pids) == brokers, text
        storage_pids = [int(p) for p in re.findall(r"storage node \d+ listening on \S+ \(pid (\d+)\)",
                                                   text)]
        assert len(storage_pids) == STORAGE_NODES, text
        work = re.search(r"data and logs in (\S+)\)", text).group(1)
        assert os.path.isdir(work), text

        for i in range(brokers):
            produce_and_consume("pulsar://127.0.0.1:%d" % (broker_port + i), 10, "demo")
        status, body = http_request("GET", "http://127.0.0.1:%d/admin/v2/brokers/demo" % web_port)
        registered = sorted("127.0.0.1:%d" % (web_port + i) for i in range(brokers))
        assert status == 200 and sorted(json.loads(body)) == registered, (status, body)

        os.kill(proc.pid, signal.SIGINT)  # Ctrl-C
        try:
            code = proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail("the demo did not stop within %d s of Ctrl-C:\n%s"
                        % (STOP_TIMEOUT_S, output()))
        reader.join(timeout=10)
        assert code == 0, "exit code %s after Ctrl-C:\n%s" % (code, output())
        assert not any(_pid_alive(pid) for pid in broker_pids), "a broker outlived the demo"
        assert not _pid_alive(etcd_pid), "etcd outlived the demo"
        assert not any(_pid_alive(pid) for pid in storage_pids), "a storage node outlived the demo"
        assert not os.path.exists(work), "the demo's data dir was left behind"
    finally:
        # Whatever of the group this test created (the script and its children) still runs.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)
