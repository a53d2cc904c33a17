#!/usr/bin/env python3
"""Publishing through `magnetar proxy` against publishing to the owning broker (issue 47).

Starts etcd, three storage nodes, two `magnetar broker`s and `magnetar proxy` on loopback (the
test suite's helpers in tests/compat), then, on one topic, `magnetar perf produce` (our Rust
client, 1 KiB messages) in two shapes, each straight to the topic's owner and through the proxy,
alternated (direct, proxy, direct, proxy) in the same run:

- batched:  as fast as it goes (the client's default batching), msg/s;
- sync:     one message at a time (--sync), the publish latency p50 / p99: the proxy's added hop.

Also the proxy's CPU (user + system, from /proc) per message of the proxied batched runs. Prints
one table. Not a test: run by hand, alone on the machine:

    .venv/bin/python bench/proxy.py [--seconds 10]
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "compat"))

import conftest  # noqa: E402
from compat_util import http_request  # noqa: E402
from replicated_util import replicated_cluster  # noqa: E402
from test_proxy import Proxy  # noqa: E402


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def perf(url, topic, seconds, sync):
    cmd = [conftest.magnetar_binary(), "perf", "produce", "-u", url, "-d", str(seconds),
           "-s", "1024", "--json", topic] + (["--sync"] if sync else [])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    stream = next(s for s in report["streams"] if s["name"] == "publish")
    assert stream["errors"] == 0, stream
    return stream


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="magnetar-proxy-bench-") as tmp, \
            replicated_cluster(pathlib.Path(tmp)) as (etcd, _nodes, start_broker):
        brokers = [start_broker("b%d" % i) for i in range(2)]
        proxy = Proxy(etcd, tmp)
        try:
            ns = "public/proxy-bench-%d" % os.getpid()
            status, body = http_request("PUT", brokers[0].web_url + "/admin/v2/namespaces/" + ns,
                                        json.dumps({"bundles": {"numBundles": 4}}))
            assert status in (200, 204), body
            topic = "persistent://%s/bench" % ns
            perf(proxy.url, topic, 1, sync=True)  # the topic loaded, its bundle placed
            status, body = http_request("GET", "%s/lookup/v2/topic/%s"
                                        % (brokers[0].web_url, topic.replace("://", "/")))
            owner = json.loads(body)["brokerUrl"]
            rows = {}
            for sync in (False, True):
                for _ in range(2):
                    for where, url in (("direct", owner), ("proxy", proxy.url)):
                        before = cpu_seconds(proxy.proc.pid)
                        stream = perf(url, topic, args.seconds, sync)
                        used = cpu_seconds(proxy.proc.pid) - before
                        rows.setdefault((sync, where), []).append((stream, used))
            print("| shape | to the owner | through the proxy | ratio |")
            print("|---|---|---|---|")
            for sync in (False, True):
                direct, proxied = rows[(sync, "direct")], rows[(sync, "proxy")]
                if not sync:
                    d = sum(s["msg_per_s"] for s, _ in direct) / len(direct)
                    p = sum(s["msg_per_s"] for s, _ in proxied) / len(proxied)
                    cpu = sum(u for _, u in proxied) / max(1, sum(s["messages"] for s, _ in proxied))
                    print("| batched, msg/s | %.0f | %.0f | %.2f |" % (d, p, p / d))
                    print("| proxy CPU per message (batched) | | %.2f µs | |" % (cpu * 1e6))
                else:
                    for q in ("p50_us", "p99_us"):
                        d = sorted(s["latency"][q] for s, _ in direct)[0]
                        p = sorted(s["latency"][q] for s, _ in proxied)[0]
                        print("| sync publish %s (best of 2) | %d µs | %d µs | %.2f |"
                              % (q[:3], d, p, p / max(d, 1)))
        finally:
            proxy.close()


if __name__ == "__main__":
    main()
