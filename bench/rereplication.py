#!/usr/bin/env python3
"""Auto-recovery (issue 48): how long until a lost storage node's copies are made again, and what
publishing sees meanwhile.

Starts etcd, four storage nodes (`--lost-node-recovery-delay-seconds 1 --audit-interval-seconds 1
--rereplication-rate-mb RATE`) and a broker (ensemble 2, write and ack quorum 2) on loopback (the
test suite's helpers in tests/compat). Writes `--mb` MB to one topic (1 KiB messages, kept by a
retention policy), unloads it (its ledgers closed), then measures publish latency on another topic
(`magnetar perf produce`, a fixed `--publish-rate`) for `--seconds`; SIGKILLs the node that holds
the most closed-ledger copies and measures again, over the same time, while auto-recovery copies
what it held, from the moment the auditor marks its ledgers. Prints the bytes the node held, the time from the kill until no ledger names it, the
time until the auditor marked its ledgers (the delay, and the auditor's takeover when the lost
node held the auditor's key), the bytes copied (the nodes' `magnetar_autorecovery_copied_bytes`)
and the copy rate from the marking to the end, and publish p50/p99 before and during. Not a test: run by hand, alone on the machine:

    .venv/bin/python bench/rereplication.py [--mb 1000] [--rate-mb 50] [--publish-rate 2000]
"""

import argparse
import collections
import json
import os
import pathlib
import subprocess
import tempfile
import threading
import time
import urllib.request

from cluster_bench import perf_produce  # first: it puts tests/compat on the path
from compat_util import http_request  # noqa: E402
from replicated_util import keys_in_etcd, ledgers_in_etcd, replicated_cluster  # noqa: E402

import conftest  # noqa: E402


def names(meta):
    return {node for fragment in meta["fragments"] for node in fragment["ensemble"]}


def copied_bytes(nodes):
    """Entry bytes auto-recovery copied, summed over the live nodes' /metrics."""
    total = 0.0
    for node in nodes:
        if node.proc.poll() is not None:
            continue
        with urllib.request.urlopen(node.metrics_url, timeout=30) as response:
            for line in response.read().decode().splitlines():
                if line.startswith("magnetar_autorecovery_copied_bytes_total"):
                    total += float(line.rsplit(" ", 1)[1])
    return total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=1000)
    parser.add_argument("--rate-mb", type=int, default=50)
    parser.add_argument("--publish-rate", type=int, default=2000)
    parser.add_argument("--seconds", type=int, default=20)
    args = parser.parse_args()
    node_args = ["--lost-node-recovery-delay-seconds", "1", "--audit-interval-seconds", "1",
                 "--rereplication-rate-mb", str(args.rate_mb)]
    with tempfile.TemporaryDirectory(prefix="magnetar-rereplication-") as tmp, \
            replicated_cluster(pathlib.Path(tmp), nodes=4, node_args=node_args) as (
                etcd, nodes, start_broker):
        broker = start_broker("b")
        ns = "public/rereplication-%d" % os.getpid()
        assert http_request("PUT", broker.web_url + "/admin/v2/namespaces/" + ns)[0] in (200, 204)
        status, body = http_request(
            "POST", "%s/admin/v2/namespaces/%s/retention" % (broker.web_url, ns),
            json.dumps({"retentionTimeInMinutes": 600, "retentionSizeInMB": 100000}))
        assert status in (200, 204), body
        kept = "persistent://%s/kept" % ns
        messages = args.mb * 1000
        cmd = [conftest.magnetar_binary(), "perf", "produce", "-u", broker.service_url,
               "-m", str(messages), "-s", "1000", "--json", kept]
        started = time.monotonic()
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        assert done.returncode == 0, done.stderr[-2000:]
        print("wrote %d MB in %.1f s" % (args.mb, time.monotonic() - started), flush=True)
        status, body = http_request("PUT", "%s/admin/v2/%s/unload" % (
            broker.web_url, kept.replace("://", "/")))
        assert status in (200, 204), body

        probe = "persistent://%s/probe" % ns
        before = perf_produce(broker.service_url, probe, args.seconds,
                              "-r", str(args.publish_rate))["latency"]
        ledgers = ledgers_in_etcd(etcd)
        holders = collections.Counter(node for meta in ledgers.values()
                                      if meta["state"] == "CLOSED" for node in names(meta))
        victim_id = holders.most_common(1)[0][0]
        victim = next(n for n in nodes if n.id == victim_id)
        during = {}
        publishing = threading.Thread(target=lambda: during.update(perf_produce(
            broker.service_url, probe, args.seconds, "-r", str(args.publish_rate))["latency"]))
        killed = time.monotonic()
        victim.kill()
        # Publishing is measured from the marking on, while the copies run (the kill's own cost,
        # the probe ledger's ensemble change, is the writer's, not auto-recovery's).
        while not keys_in_etcd(etcd, "/autorecovery/under-replicated/"):
            assert time.monotonic() - killed < 600, "not marked within 10 minutes"
            time.sleep(0.2)  # polled: the marker's creation is the event, not watched here
        marked = time.monotonic() - killed
        publishing.start()
        while any(victim_id in names(m) for m in ledgers_in_etcd(etcd).values()
                  if m["state"] == "CLOSED"):
            assert time.monotonic() - killed < 3600, "not restored within an hour"
            time.sleep(0.2)  # polled, as above
        restored = time.monotonic() - killed
        held = copied_bytes(nodes)
        publishing.join()
        print()
        print("| copied (the lost node's share) | marked after | restored after | copy rate "
              "(marked to restored) | publish p50 / p99 before | during |")
        print("|---|---|---|---|---|---|")
        print("| %.0f MB | %.1f s | %.1f s | %.1f MB/s (throttle %d MB/s) | %.2f / %.2f ms "
              "| %.2f / %.2f ms |"
              % (held / 1e6, marked, restored, held / 1e6 / max(restored - marked, 1e-3),
                 args.rate_mb, before["p50_us"] / 1e3, before["p99_us"] / 1e3,
                 during["p50_us"] / 1e3, during["p99_us"] / 1e3))


if __name__ == "__main__":
    main()
