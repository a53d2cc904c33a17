#!/usr/bin/env python3
"""Replicated ledgers benchmark (not a test; figures go to docs/benchmarks.md), issue 15.

Three set-ups side by side in one run, on this machine, each with its own processes:
  local  `magnetar standalone`: the single-node system (one copy, the broker's own journal);
  qw1    `magnetar broker` with [ledgers] storage = "nodes", 1 node, write/ack quorum 1;
  qw2    `magnetar broker` with [ledgers] storage = "nodes", 2 nodes, write/ack quorum 2.
qw1 and qw2 are separate clusters on one etcd (so each broker sees only its own nodes); every
data directory is on the same disk. `magnetar perf produce` (same client for all) runs
  async128: 128 B, batching on, as fast as possible (msg/s);
  async1k:  1 KiB, batching on (msg/s);
  sync1k:   1 KiB, one message in flight (p50, p99 latency);
  deep128:  128 B, batching on, 10,000 messages in flight instead of 1,000 (capacity: with the
            default window a producer has about one 1,000-message batch in flight, so async
            msg/s is that batch over one entry's round trip, a latency figure);
  unbatched128: 128 B, batching off, 1,000 in flight (one entry per message: the per-entry
            cost of every hop, as for producers that cannot batch);
alternating the order of the set-ups every round (this machine is shared and noisy). For each
run it records the CPU seconds of every process (broker, nodes, client) from /proc, and at the
end the journal groups (one fdatasync each) of every node and of the standalone (/metrics),
and the disk's own share of a quorum write: `magnetar disk-probe --lockstep` (one durable 4 KiB
write, and two at the same instant, in the nodes' directory), from which the sync 1 KiB floor
of qw2 on this machine follows (qw1's p50 plus what a second simultaneous write adds).

Usage: bench/replication.py [--secs 15] [--rounds 3] [--modes async128,...] [--node-dir DIR]
  [--local-dir DIR] [--variant ARGS] [--storage TOML] [--local-variant TOML] [--tls]
  (needs target/release/magnetar, or MAGNETAR_BIN, and etcd). --node-dir puts the storage
  nodes' data there (e.g. /dev/shm: no disk under the nodes, to tell the software path's cost
  from the disk's; not a durable set-up); --local-dir does the same for the standalone.
  --variant "ARGS" adds a set-up qw2v: qw2 with ARGS given to its storage nodes (an A/B of a
  node option in one run). --storage "TOML" gives every server (the standalone, the nodes) a
  [storage] section with TOML in it (e.g. 'sync_mode = "dsync"'); --local-variant "TOML" adds
  a set-up localv: a standalone with that [storage] section instead (an A/B of a storage
  option). --tls adds a set-up qw2tls: qw2 with the storage protocol over TLS (the nodes'
  [tls] with client certificates required, the broker's [ledgers] tls_* files).
Writes bench/results/replication-<date>/ (JSON per run, summary.txt)."""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("MAGNETAR_BIN", os.path.join(ROOT, "target", "release", "magnetar"))
TICK = os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def wait_http(url, proc, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit("process exited during start-up: %s" % proc.args)
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)  # another process's start-up: nothing to wait on
    sys.exit("not ready: %s" % url)


def delete_topic(web_port, topic):
    url = "http://127.0.0.1:%d/admin/v2/persistent/public/default/%s?force=true" % (web_port, topic)
    request = urllib.request.Request(url, method="DELETE")
    try:
        with urllib.request.urlopen(request, timeout=60):
            pass
    except OSError as e:
        print("warning: could not delete %s: %s" % (topic, e), flush=True)


class Procs:
    def __init__(self, work):
        self.work = work
        self.procs = []

    def start(self, name, args, **kw):
        log = open(os.path.join(self.work, name + ".log"), "wb")
        proc = subprocess.Popen(args, stdout=kw.pop("stdout", log), stderr=log,
                                stdin=subprocess.DEVNULL, env=dict(os.environ, NO_COLOR="1"), **kw)
        self.procs.append(proc)
        return proc

    def stop(self):
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--secs", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="async128,async1k,sync1k,deep128,unbatched128")
    parser.add_argument("--node-dir", default=None)
    parser.add_argument("--local-dir", default=None,
                        help="where the standalone keeps its data (with --node-dir /dev/shm: "
                             "the software paths alone, side by side)")
    parser.add_argument("--variant", default=None,
                        help="extra storage node arguments for a fourth set-up, qw2v (qw2 with them)")
    parser.add_argument("--storage", default="",
                        help="[storage] settings (TOML) for every server")
    parser.add_argument("--local-variant", default=None,
                        help="[storage] settings (TOML) of a fifth set-up, localv (a standalone)")
    parser.add_argument("--tls", action="store_true",
                        help="a set-up qw2tls: qw2 with the storage protocol over TLS (client "
                             "certificates required; test certificates made with openssl)")
    args = parser.parse_args()
    etcd_bin = shutil.which("etcd")
    if not etcd_bin or not os.access(BIN, os.X_OK):
        sys.exit("needs etcd and %s" % BIN)
    out = os.path.join(ROOT, "bench", "results", "replication-" + time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out)
    work = tempfile.mkdtemp(prefix="magnetar-replication-bench-", dir="/var/tmp")
    shm = tempfile.mkdtemp(prefix="magnetar-replication-etcd-", dir="/dev/shm")
    node_dir = tempfile.mkdtemp(prefix="magnetar-replication-nodes-", dir=args.node_dir or work)
    local_dir = tempfile.mkdtemp(prefix="magnetar-replication-local-", dir=args.local_dir or work)
    procs = Procs(out)
    try:
        etcd_port, peer = free_port(), free_port()
        endpoint = "http://127.0.0.1:%d" % etcd_port
        procs.start("etcd", [etcd_bin, "--name", "b", "--data-dir", shm + "/etcd",
                             "--listen-client-urls", endpoint, "--advertise-client-urls", endpoint,
                             "--listen-peer-urls", "http://127.0.0.1:%d" % peer,
                             "--initial-advertise-peer-urls", "http://127.0.0.1:%d" % peer,
                             "--initial-cluster", "b=http://127.0.0.1:%d" % peer])
        etcd_url = "etcd://127.0.0.1:%d" % etcd_port
        setups = {}  # name -> {url, pids: {component: pid}, nodes: [(name, proc)]}

        def storage_config(name, toml):
            path = os.path.join(work, name + "-storage.toml")
            with open(path, "w") as f:
                f.write("[storage]\n%s\n" % toml)
            return path

        # local: standalone (localv: with other [storage] settings).
        local_setups = [("local", args.storage)]
        if args.local_variant is not None:
            local_setups.append(("localv", args.local_variant))
        for name, toml in local_setups:
            port, web = free_port(), free_port()
            local = procs.start(name, [BIN, "standalone", "--broker-port", str(port),
                                       "--web-port", str(web), "--config",
                                       storage_config(name, toml),
                                       "--data-dir", tempfile.mkdtemp(prefix=name, dir=local_dir)])
            wait_http("http://127.0.0.1:%d/admin/v2/brokers/ready" % web, local)
            setups[name] = {"url": "pulsar://127.0.0.1:%d" % port, "web": web,
                            "pids": {"broker": local.pid}, "nodes": []}
        node_config = storage_config("nodes", args.storage)

        # (name, nodes, extra node arguments, node config file, extra [ledgers] TOML)
        node_setups = [("qw1", 1, [], node_config, ""), ("qw2", 2, [], node_config, "")]
        if args.variant:
            node_setups.append(("qw2v", 2, args.variant.split(), node_config, ""))
        if args.tls:
            sys.path.insert(0, os.path.join(ROOT, "tests", "compat"))
            from tls_certs import Certs
            certs = Certs(os.path.join(work, "certs"))
            ca = certs.ca("bench-ca")
            node, broker = certs.leaf(ca, "node"), certs.leaf(ca, "broker")
            tls_config = storage_config("nodes-tls", args.storage + (
                '\n[tls]\nenabled = true\ncert_file = "%s"\nkey_file = "%s"\n'
                'trust_certs_file = "%s"\nrequire_trusted_client_cert = true\n'
                % (node["cert"], node["key"], ca["cert"])))
            node_setups.append(("qw2tls", 2, [], tls_config,
                                'tls_trust_certs_file = "%s"\ntls_cert_file = "%s"\n'
                                'tls_key_file = "%s"\n' % (ca["cert"], broker["cert"], broker["key"])))
        for name, nodes, extra, this_node_config, ledgers_toml in node_setups:
            done = subprocess.run([BIN, "metadata", "init", "--metadata", etcd_url, "--cluster", name,
                                   "--web-service-url", "http://127.0.0.1:1",
                                   "--broker-service-url", "pulsar://127.0.0.1:1"],
                                  capture_output=True, text=True, timeout=60)
            if done.returncode != 0:
                sys.exit(done.stderr)
            node_procs = []
            for i in range(nodes):
                metrics_port = free_port()
                node = procs.start("%s-node%d" % (name, i),
                                   [BIN, "storage", "--metadata", etcd_url, "--cluster", name,
                                    "--listen", "127.0.0.1:0", "--gc-seconds", "5", "--data-dir",
                                    "%s/%s-node%d" % (node_dir, name, i),
                                    "--metrics-listen", "127.0.0.1:%d" % metrics_port,
                                    "--config", this_node_config] + extra,
                                   stdout=subprocess.PIPE)
                line = node.stdout.readline().decode()
                if "listening" not in line:
                    sys.exit("storage node did not start: %r" % line)
                node_procs.append(("node%d" % i, node, metrics_port))
            config = os.path.join(work, name + ".toml")
            with open(config, "w") as f:
                f.write('[ledgers]\nstorage = "nodes"\nensemble_size = %d\nwrite_quorum = %d\n'
                        'ack_quorum = %d\n%s' % (nodes, nodes, nodes, ledgers_toml))
            port, web = free_port(), free_port()
            broker = procs.start(name, [BIN, "broker", "--metadata", etcd_url, "--cluster", name,
                                        "--config", config, "--broker-port", str(port),
                                        "--web-port", str(web), "--data-dir", work + "/" + name])
            wait_http("http://127.0.0.1:%d/admin/v2/brokers/ready" % web, broker)
            pids = {"broker": broker.pid}
            pids.update({n: p.pid for n, p, _ in node_procs})
            setups[name] = {"url": "pulsar://127.0.0.1:%d" % port, "web": web, "pids": pids,
                            "nodes": node_procs}

        all_modes = {"async128": ["-s", "128"], "async1k": ["-s", "1024"],
                     "sync1k": ["-s", "1024", "--sync"], "deep128": ["-s", "128", "-o", "10000"],
                     "unbatched128": ["-s", "128", "--disable-batching"]}
        modes = {m: all_modes[m] for m in args.modes.split(",")}
        names = list(setups)
        results = []
        for rnd in range(1, args.rounds + 1):
            for mode, flags in modes.items():
                order = names[rnd % len(names):] + names[:rnd % len(names)]
                for name in order:
                    setup = setups[name]
                    before = {c: cpu_seconds(p) for c, p in setup["pids"].items()}
                    t0 = time.monotonic()
                    perf = subprocess.run(
                        [BIN, "perf", "produce", "-u", setup["url"], "-d", str(args.secs), "--json"]
                        + flags + ["bench-%s-%s-%d" % (name, mode, rnd)],
                        capture_output=True, text=True, timeout=args.secs * 4 + 60)
                    elapsed = time.monotonic() - t0
                    if perf.returncode != 0:
                        sys.exit("perf failed: %s" % perf.stderr[-2000:])
                    usage = {c: (cpu_seconds(p) - before[c]) / elapsed
                             for c, p in setup["pids"].items()}
                    # Its data goes (a deep run writes ~5 GB per copy): deleted topic, freed
                    # ledgers (nodes collect every 5 s).
                    delete_topic(setup["web"], "bench-%s-%s-%d" % (name, mode, rnd))
                    stream = json.loads(perf.stdout)["streams"][0]
                    results.append({"round": rnd, "mode": mode, "setup": name,
                                    "msg_per_s": stream["msg_per_s"],
                                    "p50_ms": stream["latency"]["p50_us"] / 1000.0,
                                    "p99_ms": stream["latency"]["p99_us"] / 1000.0,
                                    "cpu_cores": usage})
                    print("round %d %-12s %-6s %10.0f msg/s  p50 %.3f ms  p99 %.3f ms  cpu %s"
                          % (rnd, mode, name, stream["msg_per_s"], results[-1]["p50_ms"],
                             results[-1]["p99_ms"],
                             " ".join("%s=%.2f" % kv for kv in usage.items())), flush=True)
        with open(os.path.join(out, "runs.json"), "w") as f:
            json.dump(results, f, indent=1)

        # Journal groups (one fdatasync each), from every server's /metrics.
        def journal_groups(port):
            with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port) as r:
                text = r.read().decode()
            return sum(float(m) for m in re.findall(
                r"^magnetar_journal_groups(?:_total)?(?:\{[^}]*\})? (\S+)$", text, re.M))
        groups = {n: journal_groups(setups[n]["web"]) for n in setups if not setups[n]["nodes"]}
        for name in [n for n in setups if setups[n]["nodes"]]:
            for node, _, metrics_port in setups[name]["nodes"]:
                groups["%s-%s" % (name, node)] = journal_groups(metrics_port)
        procs.stop()
        busy = args.rounds * len(modes) * args.secs
        lines = ["journal groups (fdatasyncs) over ~%d s of load per set-up: %s" % (busy, groups)]
        # The disk's share of a quorum write, measured with nothing else running: one durable
        # 4 KiB write, and two at the same instant (two nodes on this one disk).
        probe = subprocess.run([BIN, "disk-probe", "--lockstep", "--threads", "1,2",
                                "--block-size", "4", "--seconds", "3", "--json",
                                "--dir", os.path.join(node_dir, "disk-probe")],
                               capture_output=True, text=True, timeout=120)
        disk = {}
        if probe.returncode == 0:
            rows = json.loads(probe.stdout[probe.stdout.index("["):])
            disk = {r["threads"]: r["round"]["p50_us"] / 1000.0 for r in rows}
            lines.append("disk (disk-probe --lockstep, 4 KiB O_DIRECT|O_DSYNC, nodes' dir): one "
                         "write p50 %.3f ms, two at the same instant %.3f ms (+%.3f)"
                         % (disk[1], disk[2], disk[2] - disk[1]))
        else:
            print("warning: disk-probe failed: %s" % probe.stderr[-500:], flush=True)
        for mode in modes:
            for name in names:
                runs = [r for r in results if r["mode"] == mode and r["setup"] == name]
                rates = sorted(r["msg_per_s"] for r in runs)
                p50 = sorted(r["p50_ms"] for r in runs)
                p99 = sorted(r["p99_ms"] for r in runs)
                cpu = {c: sorted(r["cpu_cores"][c] for r in runs)[len(runs) // 2]
                       for c in runs[0]["cpu_cores"]}
                lines.append("%-12s %-6s msg/s median %9.0f %s  p50 median %.3f ms  p99 median %.3f"
                             " ms %s  cpu cores (median) %s"
                             % (mode, name, rates[len(rates) // 2], [round(x) for x in rates],
                                p50[len(p50) // 2], p99[len(p99) // 2], [round(x, 3) for x in p99],
                                " ".join("%s=%.2f" % kv for kv in cpu.items())))
        if "sync1k" in modes and disk and "qw1" in names:
            p50 = {n: sorted(r["p50_ms"] for r in results
                             if r["mode"] == "sync1k" and r["setup"] == n) for n in names}
            median = {n: v[len(v) // 2] for n, v in p50.items()}
            floor = median["qw1"] + disk[2] - disk[1]
            lines.append("sync1k floor of qw2 on this disk: qw1 p50 + (two writes - one) = %.3f ms"
                         " = %.2fx local (qw2 measured %.3f ms = %.2fx)"
                         % (floor, floor / median["local"], median["qw2"],
                            median["qw2"] / median["local"]))
        summary = "\n".join(lines)
        print(summary)
        with open(os.path.join(out, "summary.txt"), "w") as f:
            f.write(summary + "\n")
        print("results:", out)
    finally:
        procs.stop()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(node_dir, ignore_errors=True)
        shutil.rmtree(local_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
