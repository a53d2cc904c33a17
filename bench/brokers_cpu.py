#!/usr/bin/env python3
"""Three brokers against one, in broker CPU per message (issue 47).

Starts etcd, three storage nodes and three `magnetar broker`s on loopback (the test suite's
helpers in tests/compat), shedding and automatic splits off; a namespace of four bundles and
twelve topics. `magnetar perf produce` (our Rust client, 1 KiB messages, its default batching) sends
a fixed rate over all twelve topics, through the service URL of all three brokers, in two
placements alternated in the same run (one, three, one at a third, and again):

- one:   every bundle moved to one broker (an unload with a destination): one broker does the work;
- three: the bundles spread over the three brokers;
- one at a third: one broker again, at a third of the rate: the load each broker has in "three",
  which tells what comes from a process doing less work per wake-up (its per-read and per-batch
  costs spread over fewer messages) from what comes from several brokers being one service.

The figure is the brokers' CPU (user + system, from /proc, all three summed) per acknowledged
message: what several brokers cost per message over one (lookups, redirects, ownership checks and
three processes' fixed costs); and the same with the brokers' idle CPU over as long, measured just
before, taken off (probes, load reports, housekeeping: the fixed costs). Prints one table. Not a test: run by hand, alone on the machine:

    .venv/bin/python bench/brokers_cpu.py [--seconds 15] [--rate 12000]
"""

import argparse
import json
import pathlib
import tempfile
import time

from cluster_bench import (FIXED_PLACEMENT, cpu_seconds, create_namespace, move_bundles,
                           perf_produce, service_url)  # first: it puts tests/compat on the path
from compat_util import http_request  # noqa: E402
from replicated_util import replicated_cluster  # noqa: E402

TOPICS = 12


def perf(url, topic, seconds, rate):
    return perf_produce(url, topic, seconds, "-t", str(TOPICS), "-r", str(rate))


def owners(brokers, ns):
    found = set()
    for i in range(TOPICS):
        status, body = http_request("GET", "%s/lookup/v2/topic/persistent/%s/cpu-%d"
                                    % (brokers[0].web_url, ns, i))
        assert status == 200, body
        found.add(json.loads(body)["brokerUrl"])
    return found


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--rate", type=int, default=12000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="magnetar-brokers-cpu-") as tmp, \
            replicated_cluster(pathlib.Path(tmp)) as (_etcd, _nodes, start_broker):
        brokers = [start_broker("b%d" % i, FIXED_PLACEMENT) for i in range(3)]
        ns = create_namespace(brokers[0], "cpu")
        url = service_url(brokers)
        topic = "persistent://%s/cpu" % ns
        perf(url, topic, 2, 1000)  # the topics loaded, their bundles placed
        rows = {"one": [], "three": [], "third": []}
        for _ in range(2):
            for shape in ("one", "three", "third"):
                spread = shape == "three"
                rate = args.rate // 3 if shape == "third" else args.rate
                move_bundles(brokers, ns, lambda i: brokers[i % 3] if spread else brokers[0])
                serving = owners(brokers, ns)
                assert len(serving) == (3 if spread else 1), serving
                perf(url, topic, 2, rate)  # clients settled on the owners
                # The brokers' idle cost (probes, load reports, housekeeping) over as long.
                before = sum(cpu_seconds(b.proc.pid) for b in brokers)
                time.sleep(args.seconds)  # measuring an idle interval, not waiting on an event
                idle = sum(cpu_seconds(b.proc.pid) for b in brokers) - before
                before = [cpu_seconds(b.proc.pid) for b in brokers]
                stream = perf(url, topic, args.seconds, rate)
                used = sum(cpu_seconds(b.proc.pid) for b in brokers) - sum(before)
                rows[shape].append((stream["messages"], used, stream["msg_per_s"], idle))
                print("%s: %d messages, %.2f CPU s (idle %.2f), %.1f µs/msg"
                      % (shape, stream["messages"], used, idle, used / stream["messages"] * 1e6),
                      flush=True)
        per = {k: sum(r[1] for r in v) / sum(r[0] for r in v) * 1e6 for k, v in rows.items()}
        net = {k: sum(r[1] - r[3] for r in v) / sum(r[0] for r in v) * 1e6
               for k, v in rows.items()}
        idle = {k: sum(r[3] for r in v) / len(v) / args.seconds for k, v in rows.items()}
        rate = {k: sum(r[2] for r in v) / len(v) for k, v in rows.items()}
        print()
        print("| placement (%d topics, %d msg/s asked, 1 KiB) | msg/s | broker CPU per message "
              "| the same, idle cost taken off | brokers' idle CPU |" % (TOPICS, args.rate))
        print("|---|---|---|---|---|")
        print("| one broker serves every bundle | %.0f | %.2f µs | %.2f µs | %.1f %% |"
              % (rate["one"], per["one"], net["one"], idle["one"] * 100))
        print("| the bundles over three brokers | %.0f | %.2f µs (%.2fx) | %.2f µs (%.2fx) | "
              "%.1f %% |" % (rate["three"], per["three"], per["three"] / per["one"], net["three"],
                            net["three"] / net["one"], idle["three"] * 100))
        print("| one broker, a third of the rate | %.0f | %.2f µs (%.2fx) | %.2f µs (%.2fx) | "
              "%.1f %% |" % (rate["third"], per["third"], per["third"] / per["one"], net["third"],
                            net["third"] / net["one"], idle["third"] * 100))
        print("\nthree brokers against one at the load each of them has: %.2fx (idle taken off: "
              "%.2fx)" % (per["three"] / per["third"], net["three"] / net["third"]))


if __name__ == "__main__":
    main()
