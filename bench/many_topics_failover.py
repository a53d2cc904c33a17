#!/usr/bin/env python3
"""10,000 topics on a killed broker (issue 47): how long until every one accepts a publish again.

Starts etcd, three storage nodes and three `magnetar broker`s on loopback (the test suite's
helpers in tests/compat), shedding and automatic splits off; a namespace of four bundles; one producer per topic (the official
Python client), then every bundle moved to one broker that is not the load manager's leader (an
unload with a destination) and each topic sent one message there. Then that broker is SIGKILLed and
every producer sends one message at once (asynchronously); the figures are the times from the kill
to each acknowledgement: p50, p99 and the last one (the goal: the last within 5 s). The survivors
load the topics as their clients come back, so the figure is bound by the failure detection, the
clients' reconnect back-off and the topic-load rate of the survivors. Not a test: run by hand,
alone on the machine:

    .venv/bin/python bench/many_topics_failover.py [--topics 10000]
"""

import argparse
import collections
import json
import os
import pathlib
import re
import signal
import statistics
import tempfile
import threading
import time

from cluster_bench import (FIXED_PLACEMENT, broker_id, create_namespace,  # first: the path
                           leader_id, move_bundles, service_url)

import pulsar  # noqa: E402

from compat_util import http_request  # noqa: E402
from replicated_util import replicated_cluster  # noqa: E402


def etcd_requests(endpoint):
    """etcd's answered gRPC requests so far, by method (Range, Txn, ...)."""
    _, body = http_request("GET", endpoint + "/metrics")
    out = collections.Counter()
    for line in body.decode().splitlines():
        m = re.match(r'^grpc_server_handled_total\{[^}]*grpc_method="(\w+)"[^}]*\} (\S+)$', line)
        if m:
            out[m.group(1)] += float(m.group(2))
    return out


def cpu_seconds(pid):
    """User + system CPU seconds process `pid` has used."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_by_role(etcd, nodes, survivors):
    """CPU seconds so far: etcd, the storage nodes, the surviving brokers, this client."""
    return collections.Counter({
        "etcd": cpu_seconds(etcd.proc.pid),
        "storage nodes": sum(cpu_seconds(n.proc.pid) for n in nodes),
        "surviving brokers": sum(cpu_seconds(b.proc.pid) for b in survivors),
        "client": sum(os.times()[:2]),
    })


def metadata_ops(brokers):
    """The brokers' metadata-store operations so far, by op, summed."""
    out = collections.Counter()
    for b in brokers:
        _, body = http_request("GET", b.web_url + "/metrics")
        for line in body.decode().splitlines():
            m = re.match(r'^magnetar_metadata_operations_total\{[^}]*op="(\w+)"[^}]*\} (\S+)$',
                         line)
            if m:
                out[m.group(1)] += float(m.group(2))
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--topics", type=int, default=10000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="magnetar-many-topics-") as tmp, \
            replicated_cluster(pathlib.Path(tmp)) as (etcd, nodes, start_broker):
        brokers = [start_broker("b%d" % i, FIXED_PLACEMENT) for i in range(3)]
        ns = create_namespace(brokers[0], "many")
        leader = leader_id(brokers[0])
        victim = next(b for b in brokers if broker_id(b) != leader)
        url = service_url(brokers)
        client = pulsar.Client(url, operation_timeout_seconds=60, io_threads=2)
        t = time.monotonic()
        producers = []
        for i in range(args.topics):
            producers.append(client.create_producer(
                "persistent://%s/t-%d" % (ns, i), batching_enabled=False,
                send_timeout_millis=60000))
        loaded_s = time.monotonic() - t
        # Then every bundle to the victim (a bundle nobody owns yet has nothing to move).
        move_bundles(brokers, ns, lambda _: victim)
        for p in producers:
            p.send(b"before")
        for i in range(min(args.topics, 40)):  # every bundle's topics are there
            status, body = http_request("GET", "%s/lookup/v2/topic/persistent/%s/t-%d"
                                        % (brokers[0].web_url, ns, i))
            assert json.loads(body)["brokerUrl"] == victim.service_url, body
        print("%d topics created in %.1f s (%.0f topics/s), all on %s now"
              % (args.topics, loaded_s, args.topics / loaded_s, victim.service_url), flush=True)

        done, lock, acked, errors = threading.Event(), threading.Lock(), [], []

        def sent(result, _msg_id):
            now = time.monotonic()
            with lock:
                (acked if result == pulsar.Result.Ok else errors).append((now, result))
                if len(acked) + len(errors) == len(producers):
                    done.set()

        survivors = [b for b in brokers if b is not victim]
        etcd_before, ops_before = etcd_requests(etcd.endpoint), metadata_ops(survivors)
        cpu_before = cpu_by_role(etcd, nodes, survivors)
        os.kill(victim.proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        for p in producers:
            p.send_async(b"after", sent)
        assert done.wait(180), "not every send answered within 180 s: %d acked, %d failed" % (
            len(acked), len(errors))
        last = time.monotonic()
        cpu_spent = cpu_by_role(etcd, nodes, survivors) - cpu_before
        victim.proc.wait(30)
        etcd_spent = etcd_requests(etcd.endpoint) - etcd_before
        ops_spent = metadata_ops(survivors) - ops_before
        times = sorted(t - killed for t, _ in acked)
        if errors:
            failed_at = sorted(t - killed for t, _ in errors)
            kinds = sorted({str(r) for _, r in errors})
            print("send errors %s, %.2f s to %.2f s after the kill" % (kinds, failed_at[0],
                                                                       failed_at[-1]))
        print()
        print("| measurement (%d topics on the killed broker) | figure |" % args.topics)
        print("|---|---|")
        print("| SIGKILL to each topic's next acknowledged publish | p50 %.2f s, p99 %.2f s, last "
              "%.2f s; %d send errors |" % (statistics.median(times),
                                            times[int(len(times) * 0.99) - 1], times[-1],
                                            len(errors)))
        print("| the same topics' creation (first load), for the load rate | %.1f s, %.0f "
              "topics/s |" % (loaded_s, args.topics / loaded_s))
        per_topic = lambda c: ", ".join("%s %.1f" % (k, v / args.topics)
                                        for k, v in sorted(c.items()) if v)
        print("| etcd requests per topic, kill to last acknowledgement (whole cluster) | %s |"
              % per_topic(etcd_spent))
        print("| the survivors' metadata operations per topic | %s |" % per_topic(ops_spent))
        print("| CPU seconds, kill to last acknowledgement (%.1f s: %.1f on 2 cores) | %s |"
              % (last - killed, 2 * (last - killed),
                 ", ".join("%s %.1f" % kv for kv in sorted(cpu_spent.items()))))
        client.close()


if __name__ == "__main__":
    main()
