#!/usr/bin/env python3
"""How fast a broker on etcd loads topics (issue 47: failover is bounded by how fast a new owner
loads the topics it takes over).

Starts etcd on loopback (`--members 1` or `3`, data on /dev/shm), `magnetar metadata init`, and
one `magnetar broker` (local ledgers), then with `magnetar perf produce`:

- new:     N producers on N new topics (each load creates the topic);
- reload:  the broker restarted (SIGTERM, start), the same N producers again: every topic loaded
           from its metadata, as a new owner loads a dead broker's topics;

and reports topics/s for each, with the etcd requests each load cost (etcd's own
`grpc_server_handled_total` for Range and Txn, summed over the members, divided by N) and the etcd requests per second that made (when two builds sustain the same
requests/s, etcd on this machine is the bound and fewer requests per load is the only way
faster). Not a test: run by hand, alone on the machine:

    .venv/bin/python bench/topic_load.py [--topics 10000] [--members 3]

(MAGNETAR_BIN=path runs another build, e.g. the previous commit's, for a side-by-side run.)
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "compat"))

from compat_util import free_port  # noqa: E402
from etcd_util import etcd_binary, scratch_dir  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
BINARY = os.environ.get("MAGNETAR_BIN") or os.path.join(ROOT, "target", "release", "magnetar")
CLUSTER = "bench"


def start_etcd(members, base):
    names = ["m%d" % i for i in range(members)]
    ports = {n: (free_port(), free_port()) for n in names}
    initial = ",".join("%s=http://127.0.0.1:%d" % (n, ports[n][1]) for n in names)
    procs = []
    for n in names:
        client, peer = ports[n]
        cmd = [etcd_binary(), "--name", n, "--data-dir", os.path.join(base, n),
               "--listen-client-urls", "http://127.0.0.1:%d" % client,
               "--advertise-client-urls", "http://127.0.0.1:%d" % client,
               "--listen-peer-urls", "http://127.0.0.1:%d" % peer,
               "--initial-advertise-peer-urls", "http://127.0.0.1:%d" % peer,
               "--initial-cluster", initial, "--initial-cluster-state", "new"]
        log = open(os.path.join(base, n + ".log"), "wb")
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL))
    endpoints = ["http://127.0.0.1:%d" % ports[n][0] for n in names]
    deadline = time.monotonic() + 60
    for endpoint in endpoints:
        while True:
            try:
                with urllib.request.urlopen(endpoint + "/health", timeout=2) as r:
                    if b"true" in r.read():
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "etcd not healthy"
            time.sleep(0.1)  # another process's start-up
    return procs, endpoints


def etcd_requests(endpoints):
    """(Range, Txn) gRPC requests etcd's members answered so far (a read-only transaction of
    several gets is one Txn request)."""
    ranges = txns = 0
    for endpoint in endpoints:
        with urllib.request.urlopen(endpoint + "/metrics", timeout=5) as r:
            text = r.read().decode()
        for method, value in re.findall(
                r'^grpc_server_handled_total\{[^}]*grpc_method="(Range|Txn)"[^}]*\} (\S+)$',
                text, re.M):
            if method == "Range":
                ranges += float(value)
            else:
                txns += float(value)
    return ranges, txns


def start_broker(etcd_url, data, broker_port, web_port, log):
    proc = subprocess.Popen(
        [BINARY, "broker", "--metadata", etcd_url, "--cluster", CLUSTER, "--data-dir", data,
         "--broker-port", str(broker_port), "--web-port", str(web_port)],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env=dict(os.environ, NO_COLOR="1"))
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/admin/v2/brokers/ready" % web_port,
                                        timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        assert proc.poll() is None, "broker exited"
        assert time.monotonic() < deadline, "broker not ready"
        time.sleep(0.05)  # another process's start-up


def load(broker_port, web_port, topics):
    """Creates one producer per topic (sends one message each); returns topics/s."""
    out = subprocess.run(
        [BINARY, "perf", "produce", "-u", "pulsar://127.0.0.1:%d" % broker_port,
         "--admin-url", "http://127.0.0.1:%d" % web_port, "-t", str(topics), "-r", str(topics),
         "-m", str(topics), "-s", "16", "persistent://public/default/load"],
        capture_output=True, text=True, timeout=1800)
    found = re.search(r"created (\d+) producers in ([\d.]+) s", out.stderr)
    assert out.returncode == 0 and found, out.stderr[-3000:]
    return int(found.group(1)) / float(found.group(2))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--topics", type=int, default=10000)
    parser.add_argument("--members", type=int, default=1, choices=(1, 3))
    args = parser.parse_args()
    base = scratch_dir("magnetar-bench-load-")
    procs, broker = [], None
    try:
        procs, endpoints = start_etcd(args.members, base)
        etcd_url = "etcd://" + ",".join(e[len("http://"):] for e in endpoints)
        init = subprocess.run([BINARY, "metadata", "init", "--metadata", etcd_url, "--cluster",
                               CLUSTER, "--web-service-url", "http://127.0.0.1:8080",
                               "--broker-service-url", "pulsar://127.0.0.1:6650"],
                              capture_output=True, text=True, timeout=60)
        assert init.returncode == 0, init.stdout + init.stderr
        data = tempfile.mkdtemp(prefix="magnetar-bench-load-data-")
        broker_port, web_port = free_port(), free_port()
        log = open(os.path.join(base, "broker.log"), "wb")
        broker = start_broker(etcd_url, data, broker_port, web_port, log)
        before = etcd_requests(endpoints)
        new_rate = load(broker_port, web_port, args.topics)
        after_new = etcd_requests(endpoints)
        broker.send_signal(signal.SIGTERM)
        broker.wait(120)
        broker = start_broker(etcd_url, data, broker_port, web_port, log)
        before_reload = etcd_requests(endpoints)
        reload_rate = load(broker_port, web_port, args.topics)
        after_reload = etcd_requests(endpoints)
        broker.send_signal(signal.SIGTERM)
        broker.wait(120)
        broker = None
        per = lambda a, b: ((b[0] - a[0]) / args.topics, (b[1] - a[1]) / args.topics)  # noqa: E731
        n_r, n_t = per(before, after_new)
        r_r, r_t = per(before_reload, after_reload)
        print("| etcd members | %d topics | topics/s | etcd Range + Txn requests per load "
              "| etcd requests/s |" % args.topics)
        print("|---|---|---|---|---|")
        for what, rate, r, t in (("new", new_rate, n_r, n_t),
                                 ("reload (a new owner)", reload_rate, r_r, r_t)):
            print("| %d | %s | %.0f | %.1f + %.1f | %.0f |"
                  % (args.members, what, rate, r, t, rate * (r + t)))
        shutil.rmtree(data, ignore_errors=True)
    finally:
        if broker is not None and broker.poll() is None:
            broker.kill()
        for proc in procs:
            proc.kill()
            proc.wait(30)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
