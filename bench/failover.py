#!/usr/bin/env python3
"""Failover and unload with three brokers (issue 47), with an official client: Python (in this
process), Go (bench/clients/go, `go run`) or Java (bench/clients/AckingProducer.java, run with the
Java client pulsar-admin's classpath brings).

Starts etcd, three storage nodes and three `magnetar broker`s on loopback (the test suite's
helpers in tests/compat), then, round by round on a new topic each:

- kill:   a producer sends synchronously through the service URL of all three brokers; the topic's
          owner is SIGKILLed; the figure is the longest gap between two acknowledgements around
          the kill (the send in flight at the kill included; then the killed broker is started
          again under the same id);
- unload: the same producer; `namespaces unload` through a broker that does not own the topic;
          the figure is the longest gap between two acknowledgements around the unload;
- lookup: HTTP lookups of an owned topic at its owner and at another broker (p50 of 200 each).

Send errors are counted (the goal is none). Prints one table. Not a test: run by hand,
alone on the machine:

    .venv/bin/python bench/failover.py [--rounds 20] [--client python|go|java] [--no-unload]
"""

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
import pathlib
import signal
import subprocess

from cluster_bench import create_namespace, service_url  # first: it puts tests/compat on the path

import pulsar  # noqa: E402

from compat_util import http_request  # noqa: E402
from replicated_util import replicated_cluster  # noqa: E402


def producer_thread(service_url, topic, stop, acks, errors):
    client = pulsar.Client(service_url, operation_timeout_seconds=30)
    try:
        producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=30000)
        while not stop.is_set():
            try:
                producer.send(b"x")
                acks.append(time.monotonic())
            except Exception as error:  # noqa: BLE001: counted
                errors.append(repr(error))
    finally:
        client.close()


BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
CLIENTS_DIR = os.path.join(BENCH_DIR, "clients")


def external_command(client):
    """The command line of the Go or Java producer (arguments: service URL, topic)."""
    if client == "go":
        binary = os.path.join(tempfile.gettempdir(), "magnetar-bench-acking-producer")
        subprocess.run(["go", "build", "-o", binary, "."], cwd=os.path.join(CLIENTS_DIR, "go"),
                       check=True, timeout=900)
        return [binary]
    from pulsar_admin import classpath  # noqa: E402: only the Java client needs it
    return ["java", "-cp", classpath(), os.path.join(CLIENTS_DIR, "AckingProducer.java")]


def external_producer(command, service_url, topic, stop, acks, errors):
    """Runs the Go or Java producer until `stop`; its lines become `acks` and `errors`, each ack
    timed as its line arrives (a pipe adds microseconds to a figure in milliseconds)."""
    proc = subprocess.Popen(command + [service_url, topic], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    closer = threading.Thread(target=lambda: (stop.wait(), proc.stdin.close()), daemon=True)
    closer.start()
    try:
        for line in proc.stdout:
            now = time.monotonic()
            if line == b"a\n":
                acks.append(now)
            elif line.startswith(b"e "):
                errors.append(line[2:].decode("utf-8", "replace").strip())
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def owner_of(brokers, topic):
    status, body = http_request("GET", "%s/lookup/v2/topic/%s"
                                % (brokers[0].web_url, topic.replace("://", "/")))
    assert status == 200, body
    url = json.loads(body)["brokerUrl"]
    return next(b for b in brokers if b.service_url == url)


def one_round(brokers, topic, fault, command=None):
    stop, acks, errors = threading.Event(), [], []
    url = service_url(brokers)
    if command is None:
        worker = threading.Thread(target=producer_thread, args=(url, topic, stop, acks, errors))
    else:
        worker = threading.Thread(target=external_producer,
                                  args=(command, url, topic, stop, acks, errors))
    worker.start()
    deadline = time.monotonic() + 120  # a JVM's start and class loading included
    while len(acks) < 20:
        assert time.monotonic() < deadline and worker.is_alive(), "the producer never started"
        time.sleep(0.01)
    at = time.monotonic()
    fault()
    deadline = time.monotonic() + 60
    while not any(t > at for t in acks[-3:]) or time.monotonic() < at + 0.5:
        assert time.monotonic() < deadline, "no acknowledgement within 60 s"
        time.sleep(0.005)
    stop.set()
    worker.join(60)
    first_after = min(t for t in acks if t > at) - at
    around = [max(t for t in acks if t < at)] + [t for t in acks if t >= at]
    gap = max(b - a for a, b in zip(around, around[1:]))
    return first_after, gap, len(errors)


def summary(values):
    ordered = sorted(values)
    return "p50 %.3f s, max %.3f s" % (statistics.median(ordered), ordered[-1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--client", choices=("python", "go", "java"), default="python")
    parser.add_argument("--no-unload", action="store_true", help="only the kill rounds")
    args = parser.parse_args()
    command = None if args.client == "python" else external_command(args.client)
    with tempfile.TemporaryDirectory(prefix="magnetar-failover-") as tmp, \
            replicated_cluster(pathlib.Path(tmp)) as (_etcd, _nodes, start_broker):
        brokers = [start_broker("b%d" % i) for i in range(3)]
        ns = create_namespace(brokers[0], "failover")
        kills, unloads, errors = [], [], 0
        for r in range(args.rounds):
            topic = "persistent://%s/kill-%d" % (ns, r)
            client = pulsar.Client(brokers[r % 3].service_url, operation_timeout_seconds=30)
            client.create_producer(topic).close()
            client.close()
            owner = owner_of(brokers, topic)

            def kill():
                os.kill(owner.proc.pid, signal.SIGKILL)

            _, gap, errs = one_round(brokers, topic, kill, command)
            kills.append(gap)
            errors += errs
            owner.proc.wait(30)
            owner.start()
            print("kill round %d: %.3f s, %d errors" % (r, gap, errs), flush=True)
        unload_errors = 0
        for r in range(0 if args.no_unload else args.rounds):
            topic = "persistent://%s/unload-%d" % (ns, r)
            client = pulsar.Client(brokers[0].service_url, operation_timeout_seconds=30)
            client.create_producer(topic).close()
            client.close()
            owner = owner_of(brokers, topic)
            other = next(b for b in brokers if b is not owner)

            def unload():
                status, body = http_request("PUT", "%s/admin/v2/namespaces/%s/unload"
                                            % (other.web_url, ns))
                assert status in (200, 204), body

            _, gap, errs = one_round(brokers, topic, unload, command)
            unloads.append(gap)
            unload_errors += errs
            print("unload round %d: %.3f s, %d errors" % (r, gap, errs), flush=True)
        topic = "persistent://%s/lookup" % ns
        client = pulsar.Client(brokers[0].service_url)
        client.create_producer(topic).close()
        client.close()
        owner = owner_of(brokers, topic)
        other = next(b for b in brokers if b is not owner)
        path = "/lookup/v2/topic/" + topic.replace("://", "/")
        timings = {}
        for name, broker in (("owner", owner), ("other", other)):
            samples = []
            for _ in range(200):
                t = time.monotonic()
                status, _ = http_request("GET", broker.web_url + path)
                samples.append(time.monotonic() - t)
                assert status == 200
            timings[name] = statistics.median(samples) * 1000
        print()
        print("| measurement (%d rounds, the %s client) | figure |" % (args.rounds, args.client))
        print("|---|---|")
        print("| SIGKILL of the owner: longest gap between acks | %s; %d send errors |"
              % (summary(kills), errors))
        if unloads:
            print("| namespace unload through another broker: longest gap between acks | %s; %d "
                  "send errors |" % (summary(unloads), unload_errors))
        print("| HTTP lookup p50 (200 each): at the owner / at another broker | %.2f ms / %.2f ms |"
              % (timings["owner"], timings["other"]))


if __name__ == "__main__":
    main()
