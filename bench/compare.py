#!/usr/bin/env python3
"""Magnetar vs Apache Pulsar standalone, side by side, on this machine, in one run.

Called by bench/compare.sh (which finds the Pulsar anchor and builds the binary). Both brokers
fsync before acknowledging (Pulsar: journalSyncData=true). Both are driven by the same tool,
`magnetar perf` (our client), so the client side costs the same for both.

Cases (the workload table Pulsar operators publish):
  sync      one message in flight: 128 B, 1 KiB, 16 KiB, 512 KiB
  async     one producer, one partition, batching on: 128 B, 1 KiB, 16 KiB
  drain     consume a backlog of BACKLOG x 1 KiB messages
  e2e       publish-to-receive latency at a fixed E2E_RATE msg/s of 1 KiB
  idle      PSS right after start, time from launch to ready
Prints one table (both systems and the ratio), the raw fdatasync p50 / p99 of the disk and the
host's CPU stalls (vCPU time taken away for whole milliseconds), measured in the same run, and
writes it with the raw JSON under bench/results/.

The systems alternate by rounds (--rounds 2: Magnetar, Pulsar, Pulsar, Magnetar), each round a
fresh start of the broker running every case; each figure is the median over a system's rounds,
so a change of weather on this shared host moves both halves alike. The host's weather is
measured twice: the stall probe before each round (no broker running) and, during every case,
the CPU time the hypervisor took (steal, /proc/stat), which our own processes cannot cause (a
stall probe during or right after a case also counts the broker's own background work); a ratio
whose two halves saw very different steal is flagged (!) under the table.
The backlog's subscription is created before the fill (consumers down, backlog kept on their
subscription: without one, retention trims the ledgers as they roll over), and `perf consume`
gives up (a failed run, not a hang) when no message arrived for its idle limit.
"""

import argparse
import datetime
import json
import statistics
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
BROKER_PORT, WEB_PORT = 6650, 8080
SERVICE_URL = "pulsar://127.0.0.1:%d" % BROKER_PORT
ADMIN_URL = "http://127.0.0.1:%d" % WEB_PORT


def head_and_tail(text, head=3000, tail=2000):
    """A failed run's output: its beginning carries the error message, its end the backtrace."""
    if len(text) <= head + tail:
        return text
    return "%s\n[... %d characters left out ...]\n%s" % (text[:head], len(text) - head - tail,
                                                         text[-tail:])


def log(*args):
    print("[%s]" % time.strftime("%H:%M:%S"), *args, file=sys.stderr, flush=True)


def port_busy(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def http_ok(path, timeout=0.5):
    try:
        with urllib.request.urlopen(ADMIN_URL + path, timeout=timeout) as r:
            return 200 <= r.status < 300
    except Exception:
        return False


def process_tree(pid):
    """A process and its direct children."""
    pids = [pid]
    try:
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
        pids += [int(p) for p in out.split()]
    except Exception:
        pass
    return pids


def pss_kib(pid):
    """Proportional set size of a process and its children (kB)."""
    total = 0
    for p in process_tree(pid):
        try:
            with open("/proc/%d/smaps_rollup" % p) as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


def cpu_s(pid):
    """User + system CPU seconds of a process (all its threads) and its children."""
    total = 0
    for p in process_tree(pid):
        try:
            with open("/proc/%d/stat" % p) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
        except (OSError, IndexError, ValueError):
            pass
    return total / os.sysconf("SC_CLK_TCK")


class Magnetar:
    name = "Magnetar"

    def __init__(self, binary):
        self.binary = binary
        self.proc = None
        self.tmp = None

    def start(self):
        self.tmp = tempfile.mkdtemp(prefix="magnetar-compare-", dir=os.environ.get("COMPARE_DATA_ROOT"))
        t0 = time.monotonic()
        self.log = open(os.path.join(self.tmp, "server.log"), "w")
        self.proc = subprocess.Popen(
            [self.binary, "standalone", "--data-dir", os.path.join(self.tmp, "data"),
             "--broker-port", str(BROKER_PORT), "--web-port", str(WEB_PORT)],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = t0 + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("magnetar exited during start; log in %s" % self.tmp)
            if http_ok("/admin/v2/brokers/health", 0.2) and port_busy(BROKER_PORT):
                return time.monotonic() - t0
            time.sleep(0.002)
        raise RuntimeError("magnetar not ready within 60 s")

    def pid(self):
        return self.proc.pid

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)


class Pulsar:
    name = "Apache Pulsar"

    def __init__(self, anchor):
        self.anchor = anchor

    def start(self):
        out = subprocess.run(["bash", os.path.join(self.anchor, "run.sh"), "start", "fsync"],
                             capture_output=True, text=True, timeout=600)
        sys.stderr.write(out.stderr[-2000:])
        if out.returncode != 0:
            raise RuntimeError("Pulsar did not start (run.sh start fsync)")
        if "journalSyncData\" : \"true" not in out.stderr and "bookie \"journalSyncData\" : \"true\"" not in out.stderr:
            log("warning: could not confirm journalSyncData=true in Pulsar's log")
        for token in out.stderr.split():
            if token.startswith("launch_to_health_s="):
                return float(token.split("=")[1])
        return float("nan")

    def pid(self):
        with open(os.path.join(self.anchor, "work", "broker.pid")) as f:
            return int(f.read().strip())

    def stop(self):
        subprocess.run(["bash", os.path.join(self.anchor, "run.sh"), "stop"], timeout=120)
        shutil.rmtree(os.path.join(self.anchor, "work", "data"), ignore_errors=True)


def perf(binary, mode, topic, *args, timeout=1800, broker_pid=None):
    """Runs `magnetar perf`; with broker_pid, the report gets the cores the broker and the
    client used on average over the whole invocation (warm-up included)."""
    cmd = [binary, "perf", mode, "-u", SERVICE_URL, "--admin-url", ADMIN_URL,
           "--json", "--report-interval", "5", topic] + [str(a) for a in args]
    log("  " + " ".join(cmd[1:]))
    broker0 = cpu_s(broker_pid) if broker_pid else 0.0
    steal0, total0 = cpu_ticks()
    usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    wall = time.monotonic() - t0
    usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise RuntimeError("perf failed: %s\n%s" % (" ".join(cmd), head_and_tail(out.stderr)))
    report = json.loads(out.stdout)
    steal1, total1 = cpu_ticks()
    report["steal_share"] = (steal1 - steal0) / (total1 - total0) if total1 > total0 else 0.0
    if broker_pid:
        client = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
        report["cpu"] = {"broker_cores": (cpu_s(broker_pid) - broker0) / wall,
                         "client_cores": client / wall}
    return report


def stream(report, name):
    for s in report["streams"]:
        if s["name"] == name:
            return s
    raise KeyError(name)


def raw_disk(binary, scratch):
    """Raw 4 KiB append + fdatasync latency, from `magnetar perf storage` (same disk, same run)."""
    out = subprocess.run([binary, "perf", "storage", "--dir", scratch, "--appenders", "1",
                          "--sizes", "4096", "--seconds", "2", "--json"],
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError("perf storage failed: " + out.stderr[-2000:])
    text = out.stdout[out.stdout.index("{"):]
    report = json.loads(text)
    raw = report["raw"]
    return {"growing_p50_us": raw["sync_4k_growing"]["latency"]["p50_us"],
            "growing_p99_us": raw["sync_4k_growing"]["latency"]["p99_us"],
            "prewritten_p50_us": raw["sync_4k_prewritten"]["latency"]["p50_us"],
            "prewritten_p99_us": raw["sync_4k_prewritten"]["latency"]["p99_us"]}


def _spin_for_stalls(secs, threshold_s, queue):
    """One CPU's share of the stall probe: spin on the clock and keep every gap longer than
    the threshold (the thread was runnable but not running: the vCPU was taken away)."""
    gaps = []
    last = time.perf_counter()
    end = last + secs
    while last < end:
        now = time.perf_counter()
        if now - last > threshold_s:
            gaps.append(now - last)
        last = now
    queue.put(gaps)


def host_stalls(secs=5.0, threshold_ms=0.5):
    """How often this VM's CPUs stop running for whole milliseconds with nothing else to run:
    one spinning process per CPU, gaps between clock reads above the threshold. On a shared
    host these stalls (steal) bound every tail latency measured here from below."""
    import multiprocessing
    queue = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=_spin_for_stalls, args=(secs, threshold_ms / 1000.0, queue))
             for _ in range(os.cpu_count() or 1)]
    for proc in procs:
        proc.start()
    gaps = sorted(g for _ in procs for g in queue.get(timeout=secs + 30))
    for proc in procs:
        proc.join()
    cpus = len(procs)
    return {"cpus": cpus, "secs": secs, "threshold_ms": threshold_ms,
            "stalls_per_cpu_s": len(gaps) / (cpus * secs),
            "stalled_share": sum(gaps) / (cpus * secs),
            "max_ms": gaps[-1] * 1000.0 if gaps else 0.0}


def admin_put(path, body=b""):
    """PUT on the broker's admin API (both systems speak Pulsar's); 2xx or 409 (exists) is fine."""
    req = urllib.request.Request(ADMIN_URL + path, data=body, method="PUT",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as response:
            response.read()
    except urllib.error.HTTPError as e:
        if e.code != 409:
            raise RuntimeError("PUT %s: %d %s" % (path, e.code, e.read()[:500]))


def cpu_ticks():
    """(steal, total) CPU ticks of the whole machine so far (/proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal [guest guest_nice: inside user and nice]
    return fields[7] if len(fields) > 7 else 0, sum(fields[:8])


def case(report, name):
    """Stream `name` of a perf report, with the steal share its run saw."""
    return dict(stream(report, name), steal_share=report["steal_share"])


def run_system(system, binary, opts):
    results = {}
    log("== %s: host stall probe, then start" % system.name)
    results["round_stalls"] = host_stalls()
    ready_s = system.start()
    try:
        time.sleep(opts.idle_secs)  # idle: nothing runs yet
        results["idle"] = {"ready_s": ready_s, "pss_kib": pss_kib(system.pid())}
        log("  ready in %.3f s, idle PSS %.1f MiB" % (ready_s, results["idle"]["pss_kib"] / 1024))
        stamp = str(int(time.time()))
        for size in opts.sync_sizes:
            r = perf(binary, "produce", "sync-%d-%s" % (size, stamp), "--sync", "-s", size,
                     "-d", opts.sync_secs)
            results["sync_%d" % size] = case(r, "publish")
        for size in opts.async_sizes:
            r = perf(binary, "produce", "async-%d-%s" % (size, stamp), "-s", size, "-d", opts.secs,
                     "-o", opts.max_pending, broker_pid=system.pid())
            results["async_%d" % size] = dict(case(r, "publish"), cpu=r["cpu"])
        # e2e before the backlog: it measures steady state, not the writeback of 10 GB.
        if opts.e2e_rate > 0:
            # Let the async cases' writeback finish first (both systems alike): the e2e figure is
            # the latency at 50,000 msg/s, not the tail of the previous case's disk traffic
            # (measured: p99.9 9.4 -> 3.5 ms, p99 2.27 -> 1.90 ms after a 16 KiB run).
            os.sync()
            time.sleep(opts.settle_secs)
            # The e2e tail is bounded below by the host's own stalls: measure them right before.
            results["e2e_host_stalls"] = host_stalls()
            r = perf(binary, "e2e", "e2e-%s" % stamp, "-s", 1024, "-r", opts.e2e_rate,
                     "-d", opts.secs, *opts.e2e_args)
            results["e2e"] = case(r, "e2e")
            results["e2e_publish"] = stream(r, "publish")
        if opts.backlog > 0:
            topic = "backlog-%s" % stamp
            # The drain scenario: the consumers' subscription exists, they are down while the
            # backlog builds, then they catch up.
            admin_put("/admin/v2/persistent/public/default/%s" % topic)
            admin_put("/admin/v2/persistent/public/default/%s/subscription/drain" % topic)
            r = perf(binary, "produce", topic, "-s", 1024, "-m", opts.backlog, "-o", opts.max_pending)
            results["backlog_fill"] = case(r, "publish")
            r = perf(binary, "consume", topic, "-m", opts.backlog, "--subscriptions", "drain",
                     "-q", 1000, "--idle-timeout", opts.idle_timeout)
            results["drain"] = case(r, "consume")
    finally:
        log("== %s: stop" % system.name)
        system.stop()
    return results


def median_of(rounds):
    """One system's figures over its rounds: each number the median of the rounds' (nested
    dictionaries alike), each list and string the first round's."""
    rounds = [r for r in rounds if r is not None]
    if not rounds:
        return None
    first = rounds[0]
    if isinstance(first, dict):
        return {k: median_of([r.get(k) for r in rounds]) for k in first}
    if isinstance(first, bool) or not isinstance(first, (int, float)):
        return first
    return statistics.median(rounds)


def steal_differs(a, b):
    """Whether two halves of a ratio saw very different weather: the hypervisor took over 3x
    the CPU time from one that it took from the other, and at least 1 % of it."""
    if not a or not b or "steal_share" not in a or "steal_share" not in b:
        return False
    hi, lo = max(a["steal_share"], b["steal_share"]), min(a["steal_share"], b["steal_share"])
    return hi >= 0.01 and hi > 3 * lo


def fmt_rate(v):
    return "{:,.0f}".format(v)


def table(results, raw, stalls, opts):
    m, p = results.get("magnetar", {}), results.get("pulsar", {})
    rows = []

    def ratio(a, b, higher_better=True):
        if a is None or b is None or a == 0 or b == 0:
            return "n/a"
        return "%.2fx" % ((a / b) if higher_better else (b / a))

    def lat(s, q):
        return s["latency"][q] / 1000.0 if s and s.get("latency") else None

    def ms(v):
        return "n/a" if v is None else "%.3f" % v

    flagged = []

    def throughput_row(label, key):
        a, b = m.get(key), p.get(key)
        if steal_differs(a, b):
            flagged.append("%s: Magnetar %.1f %%, Pulsar %.1f %%" % (
                label, a["steal_share"] * 100, b["steal_share"] * 100))
            label += " (!)"
        rows.append("| %s | %s | %s | %s / %s | %s | %s | %s / %s | %s | %s |" % (
            label,
            fmt_rate(a["msg_per_s"]) if a else "n/a", "%.1f" % a["mb_per_s"] if a else "n/a",
            ms(lat(a, "p50_us")), ms(lat(a, "p99_us")),
            fmt_rate(b["msg_per_s"]) if b else "n/a", "%.1f" % b["mb_per_s"] if b else "n/a",
            ms(lat(b, "p50_us")), ms(lat(b, "p99_us")),
            ratio(a and a["msg_per_s"], b and b["msg_per_s"]),
            ratio(lat(a, "p50_us"), lat(b, "p50_us"), higher_better=False)))

    out = []
    out.append("| case | Magnetar msg/s | MB/s | p50 / p99 ms | Pulsar msg/s | MB/s | p50 / p99 ms "
               "| throughput ratio | p50 latency ratio |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    for size in opts.sync_sizes:
        throughput_row("sync %s" % human(size), "sync_%d" % size)
    for size in opts.async_sizes:
        throughput_row("async batched %s" % human(size), "async_%d" % size)
    if opts.backlog > 0:
        throughput_row("backlog fill %s x 1 KiB (async batched)" % fmt_rate(opts.backlog), "backlog_fill")
        throughput_row("drain %s x 1 KiB backlog" % fmt_rate(opts.backlog), "drain")
    out += rows
    out.append("")
    if flagged:
        out.append("(!) the two halves saw very different weather (median share of the machine's "
                   "CPU time taken by the hypervisor during the case): %s." % "; ".join(flagged))
        out.append("")
    cpu_rows = []

    def cpu_cells(r):
        """Broker cores, client cores, broker CPU per message (µs) of one system's run."""
        if not (r and r.get("cpu")):
            return ("n/a", "n/a", "n/a"), None
        per_msg = r["cpu"]["broker_cores"] / r["msg_per_s"] * 1e6 if r["msg_per_s"] else None
        return ("%.2f" % r["cpu"]["broker_cores"], "%.2f" % r["cpu"]["client_cores"],
                "%.3f" % per_msg if per_msg else "n/a"), per_msg

    for size in opts.async_sizes:
        (ca, ua), (cb, ub) = cpu_cells(m.get("async_%d" % size)), cpu_cells(p.get("async_%d" % size))
        if ua is None and ub is None:
            continue
        cpu_rows.append("| async batched %s | %s | %s | %s | %s | %s | %s | %s |" % (
            (human(size),) + ca + cb + (ratio(ub, ua),)))
    if cpu_rows:
        out.append("| CPU (cores, whole run) | Magnetar broker | client | broker µs/msg "
                   "| Pulsar broker | client | broker µs/msg | broker CPU per message ratio |")
        out.append("|---|---|---|---|---|---|---|---|")
        out += cpu_rows
        out.append("")
    if opts.e2e_rate > 0:
        out.append("| e2e latency at %s msg/s, 1 KiB | p50 ms | p99 ms | p99.9 ms | max ms "
                   "| host stalls just before: per CPU-s, longest ms |" % fmt_rate(opts.e2e_rate))
        out.append("|---|---|---|---|---|---|")
        for name, r in (("Magnetar", m), ("Apache Pulsar", p)):
            s = r.get("e2e")
            if s:
                st = r.get("e2e_host_stalls")
                out.append("| %s (%s msg/s received) | %s | %s | %s | %s | %s |" % (
                    name, fmt_rate(s["msg_per_s"]), ms(lat(s, "p50_us")), ms(lat(s, "p99_us")),
                    ms(lat(s, "p999_us")), ms(lat(s, "max_us")),
                    "%.1f, %.1f" % (st["stalls_per_cpu_s"], st["max_ms"]) if st else "n/a"))
        out.append("")
    out.append("| idle | Magnetar | Apache Pulsar | ratio |")
    out.append("|---|---|---|---|")
    mi, pi = m.get("idle"), p.get("idle")
    if mi or pi:
        out.append("| PSS MiB | %s | %s | %s |" % (
            "%.1f" % (mi["pss_kib"] / 1024) if mi else "n/a",
            "%.1f" % (pi["pss_kib"] / 1024) if pi else "n/a",
            "1/%.0f" % (pi["pss_kib"] / mi["pss_kib"]) if mi and pi and mi["pss_kib"] else "n/a"))
        out.append("| launch to ready s | %s | %s | %s |" % (
            "%.3f" % mi["ready_s"] if mi else "n/a", "%.2f" % pi["ready_s"] if pi else "n/a",
            "1/%.0f" % (pi["ready_s"] / mi["ready_s"]) if mi and pi and mi["ready_s"] else "n/a"))
    out.append("")
    if raw:
        out.append("Raw disk, same run: 4 KiB append + fdatasync p50 / p99 %.3f / %.3f ms (growing file), "
                   "%.3f / %.3f ms (pre-written file)." % (
                       raw["growing_p50_us"] / 1000.0, raw["growing_p99_us"] / 1000.0,
                       raw["prewritten_p50_us"] / 1000.0, raw["prewritten_p99_us"] / 1000.0))
        s = m.get("sync_1024")
        if s and s.get("latency"):
            out.append("Magnetar sync 1 KiB p50 = %.2fx raw fdatasync p50 (growing file)." % (
                s["latency"]["p50_us"] / raw["growing_p50_us"]))
        s = p.get("sync_1024")
        if s and s.get("latency"):
            out.append("Apache Pulsar sync 1 KiB p50 = %.2fx raw fdatasync p50 (growing file)." % (
                s["latency"]["p50_us"] / raw["growing_p50_us"]))
    if stalls:
        out.append("Host CPU stalls, same run (one spinning process per CPU, %.0f s): %.1f stalls "
                   "over %.1f ms per CPU-second, %.2f%% of CPU time lost in them, longest %.1f ms." % (
                       stalls["secs"], stalls["stalls_per_cpu_s"], stalls["threshold_ms"],
                       stalls["stalled_share"] * 100.0, stalls["max_ms"]))
    return "\n".join(out)


def human(size):
    if size >= 1024 and size % 1024 == 0:
        return "%d KiB" % (size // 1024)
    return "%d B" % size


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", required=True)
    ap.add_argument("--anchor", help="Pulsar anchor directory (run.sh with fetched jars)")
    ap.add_argument("--systems", default="magnetar,pulsar")
    ap.add_argument("--secs", type=float, default=20, help="seconds per async / e2e case")
    ap.add_argument("--sync-secs", type=float, default=10, help="seconds per sync case")
    ap.add_argument("--sync-sizes", default="128,1024,16384,524288")
    ap.add_argument("--async-sizes", default="128,1024,16384")
    ap.add_argument("--max-pending", type=int, default=10000)
    ap.add_argument("--backlog", type=int, default=10_000_000)
    ap.add_argument("--e2e-rate", type=int, default=50_000)
    ap.add_argument("--e2e-args", default="", help="extra perf e2e arguments, e.g. --disable-batching")
    ap.add_argument("--idle-secs", type=float, default=5)
    ap.add_argument("--rounds", type=int, default=2,
                    help="rounds per system, alternated (2: A B B A); figures are medians")
    ap.add_argument("--idle-timeout", type=float, default=120,
                    help="the drain fails when no message arrived for this many seconds")
    ap.add_argument("--settle-secs", type=float, default=5,
                    help="pause after a sync(2) before the e2e case")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    opts = ap.parse_args()
    opts.sync_sizes = [int(s) for s in opts.sync_sizes.split(",") if s]
    opts.async_sizes = [int(s) for s in opts.async_sizes.split(",") if s]
    opts.e2e_args = opts.e2e_args.split()
    systems = opts.systems.split(",")
    if port_busy(BROKER_PORT) or port_busy(WEB_PORT):
        sys.exit("ports %d/%d are busy: stop what listens there first" % (BROKER_PORT, WEB_PORT))
    os.makedirs(opts.out, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="magnetar-compare-disk-", dir=os.environ.get("COMPARE_DATA_ROOT"))
    started = datetime.datetime.now(datetime.timezone.utc)
    try:
        log("raw disk probe")
        raw = raw_disk(opts.binary, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    log("host CPU stall probe")
    stalls = host_stalls()
    for name in systems:
        if name not in ("magnetar", "pulsar"):
            sys.exit("unknown system %r" % name)
        if name == "pulsar" and not opts.anchor:
            sys.exit("--anchor is required for pulsar")
    if opts.rounds < 1:
        sys.exit("--rounds must be at least 1")
    rounds = {name: [] for name in systems}
    for i in range(opts.rounds):
        for name in (systems if i % 2 == 0 else list(reversed(systems))):
            log("round %d of %d: %s" % (i + 1, opts.rounds, name))
            system = Magnetar(opts.binary) if name == "magnetar" else Pulsar(opts.anchor)
            rounds[name].append(run_system(system, opts.binary, opts))
    results = {name: median_of(rs) for name, rs in rounds.items()}
    text = table(results, raw, stalls, opts)
    order = [name for i in range(opts.rounds)
             for name in (systems if i % 2 == 0 else list(reversed(systems)))]
    text += "\nEach figure: the median of %d round(s) per system, alternated (%s)." % (
        opts.rounds, " ".join(order))
    seen = {name: 0 for name in systems}
    probes = []
    for name in order:
        probe = rounds[name][seen[name]]["round_stalls"]
        seen[name] += 1
        probes.append("%s %d: %.2f %% lost, %.1f per CPU-s, longest %.1f ms" % (
            name, seen[name], probe["stalled_share"] * 100, probe["stalls_per_cpu_s"],
            probe["max_ms"]))
    text += "\nStall probe before each round (no broker running): " + "; ".join(probes) + "."
    header = "Run %s UTC on %s (%d CPUs), both brokers fsync before ack; client: magnetar perf.\n" % (
        started.strftime("%Y-%m-%d %H:%M"), socket.gethostname(), os.cpu_count() or 0)
    print(header)
    print(text)
    base = os.path.join(opts.out, "compare-" + started.strftime("%Y%m%d-%H%M%S"))
    with open(base + ".md", "w") as f:
        f.write(header + "\n" + text + "\n")
    with open(base + ".json", "w") as f:
        json.dump({"started": started.isoformat(), "raw_disk": raw, "host_stalls": stalls,
                   "results": results, "rounds": rounds,
                   "options": {k: v for k, v in vars(opts).items()}}, f, indent=2)
    log("written %s.md and .json" % base)


if __name__ == "__main__":
    main()
