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
import pathlib
import tempfile

from cluster_bench import cpu_seconds, create_namespace, perf_produce  # first: the path

from compat_util import http_request  # noqa: E402
from replicated_util import replicated_cluster  # noqa: E402
from test_proxy import Proxy  # noqa: E402


def perf(url, topic, seconds, sync):
    return perf_produce(url, topic, seconds, *(["--sync"] if sync else []))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="magnetar-proxy-bench-") as tmp, \
            replicated_cluster(pathlib.Path(tmp)) as (etcd, _nodes, start_broker):
        brokers = [start_broker("b%d" % i) for i in range(2)]
        proxy = Proxy(etcd, tmp)
        try:
            ns = create_namespace(brokers[0], "proxy-bench")
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
