#!/usr/bin/env python3
"""How soon a policy set through one broker reaches a topic loaded on another (cluster mode).

etcd on loopback (data in /dev/shm), `magnetar metadata init`, two storage nodes and two
`magnetar broker`s on it (A and B, ledgers on the nodes: brokers that share a cluster cannot
keep them on their own disks). A producer on broker A publishes to a topic of a
namespace of its own with explicit sequence ids. Each round flips deduplication through an
admin API, then probes from A at once and without pause (a sequence id sent twice: the second
answered -1:-1 means deduplication is on) until A follows; the time from the admin answer to
the first probe that shows the new state is the round's figure. Rounds alternate:
- `namespace via B`: `POST /admin/v2/namespaces/{ns}/deduplication` on broker B (A learns of it
  through its etcd watch);
- `topic via B`: `POST .../{topic}/deduplicationEnabled` on broker B (the same, another key);
- `namespace via A`: the same call on broker A itself (its admin API refreshes the topic
  before it answers: the direct path, for comparison).
A probe costs two synchronous sends (about 0.3-1 ms here), which is the resolution.

Usage: .venv/bin/python bench/policy_watch.py [--rounds 20]   (needs the Python client,
etcd, and target/release/magnetar or MAGNETAR_BIN). Figures: docs/benchmarks.md.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import pulsar

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("MAGNETAR_BIN", os.path.join(ROOT, "target", "release", "magnetar"))
CLUSTER = "policy-bench"
NAMESPACE = "public/policy-bench"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(method, url, body=None):
    """One admin call; a 307 to the topic's owner (as Pulsar answers) is followed once, body and
    method kept, as pulsar-admin does."""
    data = None if body is None else body.encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as e:
        if e.code != 307 or not e.headers.get("Location"):
            raise
        return request(method, e.headers["Location"], body)


def wait_logged(path, text, proc, timeout=60):
    """Waits until `text` is in the log at `path` (a storage node's "listening on" line)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit("exited during start-up: %s" % proc.args)
        with open(path, "rb") as f:
            if text.encode() in f.read():
                return
        time.sleep(0.1)  # another process's start-up: nothing to wait on
    sys.exit("not started: %s" % proc.args)


def wait_ready(web, proc, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit("exited during start-up: %s" % proc.args)
        try:
            if request("GET", web + "/admin/v2/brokers/ready") == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)  # another process's start-up: nothing to wait on
    sys.exit("not ready: %s" % web)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20, help="rounds per kind")
    args = parser.parse_args()
    etcd_bin = shutil.which("etcd")
    if not etcd_bin or not os.access(BIN, os.X_OK):
        sys.exit("needs etcd and %s" % BIN)
    work = tempfile.mkdtemp(prefix="magnetar-policy-bench-")
    shm = tempfile.mkdtemp(prefix="magnetar-policy-bench-etcd-", dir="/dev/shm")
    procs = []

    def start(name, argv):
        log = open(os.path.join(work, name + ".log"), "wb")
        proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                env=dict(os.environ, NO_COLOR="1"))
        procs.append(proc)
        return proc

    client = None
    try:
        port, peer = free_port(), free_port()
        endpoint = "http://127.0.0.1:%d" % port
        start("etcd", [etcd_bin, "--name", "p", "--data-dir", shm + "/etcd",
                       "--listen-client-urls", endpoint, "--advertise-client-urls", endpoint,
                       "--listen-peer-urls", "http://127.0.0.1:%d" % peer,
                       "--initial-advertise-peer-urls", "http://127.0.0.1:%d" % peer,
                       "--initial-cluster", "p=http://127.0.0.1:%d" % peer])
        etcd_url = "etcd://127.0.0.1:%d" % port
        deadline = time.monotonic() + 30
        while True:
            done = subprocess.run([BIN, "metadata", "init", "--metadata", etcd_url, "--cluster",
                                   CLUSTER], capture_output=True, text=True, timeout=60)
            if done.returncode == 0:
                break
            if time.monotonic() > deadline:
                sys.exit(done.stderr)
            time.sleep(0.2)  # etcd starting: nothing to wait on
        for name in ("n1", "n2"):
            node = start("storage-" + name, [
                BIN, "storage", "--metadata", etcd_url, "--cluster", CLUSTER,
                "--listen", "127.0.0.1:0", "--data-dir", os.path.join(work, "data-" + name)])
            wait_logged(os.path.join(work, "storage-" + name + ".log"), "listening on", node)
        config = os.path.join(work, "broker.toml")
        with open(config, "w") as f:
            f.write('[ledgers]\nstorage = "nodes"\nensemble_size = 2\nwrite_quorum = 2\n'
                    'ack_quorum = 2\n')
        brokers = {}
        for name in ("a", "b"):
            broker_port, web_port = free_port(), free_port()
            proc = start("broker-" + name, [
                BIN, "broker", "--metadata", etcd_url, "--cluster", CLUSTER,
                "--broker-port", str(broker_port), "--web-port", str(web_port),
                "--data-dir", os.path.join(work, "data-" + name), "--config", config])
            web = "http://127.0.0.1:%d" % web_port
            wait_ready(web, proc)
            brokers[name] = {"service": "pulsar://127.0.0.1:%d" % broker_port, "web": web}
        request("PUT", brokers["b"]["web"] + "/admin/v2/namespaces/" + NAMESPACE)
        topic = "persistent://%s/t" % NAMESPACE
        client = pulsar.Client(brokers["a"]["service"], operation_timeout_seconds=30,
                               logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
        producer = client.create_producer(topic, producer_name="p", batching_enabled=False)
        sequence = [1_000]

        def deduplicating():
            sequence[0] += 1
            producer.send(b"x", sequence_id=sequence[0])
            again = producer.send(b"x", sequence_id=sequence[0])
            return again.ledger_id() == -1 and again.entry_id() == -1

        kinds = {
            "namespace via B": lambda on: request(
                "POST", "%s/admin/v2/namespaces/%s/deduplication" % (brokers["b"]["web"],
                                                                       NAMESPACE), on),
            "topic via B": lambda on: request(
                "POST", "%s/admin/v2/persistent/%s/t/deduplicationEnabled"
                % (brokers["b"]["web"], NAMESPACE), on),
            "namespace via A": lambda on: request(
                "POST", "%s/admin/v2/namespaces/%s/deduplication" % (brokers["a"]["web"],
                                                                       NAMESPACE), on),
        }
        figures = {kind: [] for kind in kinds}
        probes = {kind: [] for kind in kinds}

        def follow(expected, kind):
            """Probes until A shows `expected`; returns (ms since now, probes)."""
            answered = time.monotonic()
            count = 0
            while True:
                count += 1
                if deduplicating() == expected:
                    return (time.monotonic() - answered) * 1000, count
                if time.monotonic() - answered > 30:
                    sys.exit("%s: not followed within 30 s" % kind)

        namespace_on, topic_set = False, False
        for _ in range(args.rounds):
            for kind, set_policy in kinds.items():
                if kind.startswith("namespace"):
                    if topic_set:
                        # The topic's own setting wins over the namespace's: remove it first.
                        request("DELETE", "%s/admin/v2/persistent/%s/t/deduplicationEnabled"
                                % (brokers["b"]["web"], NAMESPACE))
                        follow(namespace_on, "removal")
                        topic_set = False
                    namespace_on = not namespace_on
                    expected = namespace_on
                else:
                    topic_set = True
                    expected = not namespace_on  # a change A can see
                set_policy("true" if expected else "false")
                took, count = follow(expected, kind)
                figures[kind].append(took)
                probes[kind].append(count)
        print("policy change to a topic loaded on broker A, %d rounds each (ms from the admin "
              "answer to the first probe showing it; probes per round):" % args.rounds)
        summary = {}
        for kind, values in figures.items():
            values.sort()
            summary[kind] = {
                "p50_ms": round(statistics.median(values), 2),
                "p90_ms": round(values[int(len(values) * 0.9) - 1], 2),
                "max_ms": round(values[-1], 2),
                "probes_median": statistics.median(probes[kind]),
                "rounds_over_one_probe": sum(1 for n in probes[kind] if n > 1),
            }
            print("  %-16s p50 %6.2f  p90 %6.2f  max %6.2f  probes median %s, rounds needing "
                  "more than one %d" % (kind, summary[kind]["p50_ms"], summary[kind]["p90_ms"],
                                        summary[kind]["max_ms"], summary[kind]["probes_median"],
                                        summary[kind]["rounds_over_one_probe"]))
        print(json.dumps(summary))
    finally:
        if client is not None:
            client.close()
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)


if __name__ == "__main__":
    main()
