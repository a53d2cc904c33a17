"""The nemesis (issue 48): a whole cluster on loopback beaten with random faults under load from
the official Python client, and a queue checker that decides whether anything went wrong.

The cluster: a 3-member etcd, 4 storage nodes (ensemble 3, write quorum 3, ack quorum 2) and 3
brokers. Every broker reaches each etcd member through a TCP fault proxy of its own, and every
broker reaches each storage node through that node's proxy (the node listens on 127.0.0.1:P and
registers 127.0.0.2:P, where its proxy listens), so a fault can cut, stall, slow down or stall
one direction of exactly those paths.

The load: one producer per topic (deduplication on, half of them batching), each sending its
own increasing sequence ids at a steady rate, and one Failover consumer per topic acknowledging
what it receives.

Two lanes of faults run at once, each one fault at a time: the storage lane (a node SIGKILLed
and restarted, SIGSTOPped, cut off, stalled, stalled one way, slowed down, or its disk wiped and
the node started empty) and the control lane (a broker SIGKILLed and restarted, SIGSTOPped
sometimes past its etcd lease, cut off from etcd; the etcd leader SIGKILLed or SIGSTOPped). The
schedule is drawn from the seed before the run starts, printed, and the same seed draws it
again (`scripts/nemesis.sh --seed S`).

At the end every fault is healed and the checker decides (`check_topic`): no acknowledged message
lost, none stored twice, each producer's messages stored in its order, every acknowledged message
consumed by the subscription (nothing stuck) in order of first delivery, and every ledger back at
its write quorum on registered nodes (`check_ledgers`; the fragments that the one-run-per-node
rule leaves without a replacement are counted apart: issue 48's known gap).

Every process is started here and killed by its PID; every wait is bounded."""

import collections
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import threading
import time

import pulsar
import pytest

import conftest
from compat_util import free_port, http_request
from etcd_util import etcd_binary, scratch_dir
from replicated_util import (CLUSTER, StorageNode, keys_in_etcd, ledgers_in_etcd,
                             run_magnetar)

TOPICS = 4
RATE_PER_TOPIC = 40           # sends per second per producer
SEND_TIMEOUT_MS = 60_000      # a send the client gives up on is a failed send, not a lost one
ENSEMBLE, WRITE_QUORUM, ACK_QUORUM = 3, 3, 2
NODES, BROKERS, ETCD_MEMBERS = 4, 3, 3
LOST_NODE_RECOVERY_DELAY_S = 8
SESSION_TTL_S = 10
READY_TIMEOUT_S = 60
SETTLE_TIMEOUT_S = 180        # after the faults: every acknowledged message consumed, ledgers whole
NODE_PROXY_HOST = "127.0.0.2"


# ------------------------------------------------------------------------------- fault proxy
class FaultProxy:
    """A TCP forwarder from (listen_host, listen_port) to `target` (host, port) whose path can be
    cut (connections closed, new ones closed at once), stalled (nothing forwarded either way, as
    a partition that drops packets: TCP holds the bytes until it heals), stalled one way (only
    the answers held), or slowed down (each chunk delayed)."""

    def __init__(self, listen_host, listen_port, target):
        self.target = target
        self.address = "%s:%d" % (listen_host, listen_port)
        self._lock = threading.Condition()
        self._mode = "pass"
        self._delay_s = 0.0
        self._connections = set()
        self._closed = False
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((listen_host, listen_port))
        self._listener.listen(128)
        threading.Thread(target=self._accept, daemon=True).start()

    def set(self, mode, delay_s=0.0):
        """`pass`, `cut`, `stall`, `stall_answers` or `slow` (with `delay_s`)."""
        assert mode in ("pass", "cut", "stall", "stall_answers", "slow"), mode
        with self._lock:
            self._mode, self._delay_s = mode, delay_s
            if mode == "cut":
                for conn in list(self._connections):
                    _close_quietly(conn)
                self._connections.clear()
            self._lock.notify_all()

    def close(self):
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self.set("cut")
        _close_quietly(self._listener)

    def _accept(self):
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                refused = self._mode == "cut" or self._closed
            if refused:
                _close_quietly(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _close_quietly(client)
                continue
            with self._lock:
                self._connections.update((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _held(self, answers):
        return self._mode == "stall" or (self._mode == "stall_answers" and answers)

    def _pump(self, src, dst, answers):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                with self._lock:
                    while self._held(answers) and not self._closed and src in self._connections:
                        self._lock.wait(1.0)
                    if src not in self._connections:
                        break
                    delay = self._delay_s if self._mode == "slow" else 0.0
                if delay:
                    time.sleep(delay)  # the fault itself: this path is this slow
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._connections.discard(src)
                self._connections.discard(dst)
            _close_quietly(src)
            _close_quietly(dst)


def _close_quietly(sock):
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


def _free_port_on_both(host):
    """A port free on 127.0.0.1 (the node listens there) and on `host` (its proxy)."""
    for _ in range(100):
        port = free_port()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        return port
    raise RuntimeError("no port free on 127.0.0.1 and %s" % host)


# ------------------------------------------------------------------------------------- etcd
class EtcdCluster:
    """ETCD_MEMBERS etcd members on loopback, each started, killed and frozen by its PID."""

    def __init__(self, members=ETCD_MEMBERS):
        self.binary = etcd_binary()
        self.dir = scratch_dir("magnetar-nemesis-etcd-")
        self.client_ports = [free_port() for _ in range(members)]
        self.peer_ports = [free_port() for _ in range(members)]
        self.procs = [None] * members
        self.frozen = set()
        self.initial = ",".join("m%d=http://127.0.0.1:%d" % (i, p)
                                for i, p in enumerate(self.peer_ports))
        self.endpoints = ["http://127.0.0.1:%d" % p for p in self.client_ports]
        self.endpoint = ",".join(self.endpoints)  # etcdctl's --endpoints
        self.url = "etcd://" + ",".join("127.0.0.1:%d" % p for p in self.client_ports)

    def start(self, i=None):
        for member in ([i] if i is not None else range(len(self.procs))):
            peer = "http://127.0.0.1:%d" % self.peer_ports[member]
            cmd = [self.binary, "--name", "m%d" % member,
                   "--data-dir", os.path.join(self.dir, "m%d" % member),
                   "--listen-client-urls", self.endpoints[member],
                   "--advertise-client-urls", self.endpoints[member],
                   "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                   "--initial-cluster", self.initial, "--initial-cluster-state", "new",
                   "--heartbeat-interval", "100", "--election-timeout", "1000"]
            if shutil.which("setpriv"):
                cmd = ["setpriv", "--pdeathsig", "KILL", "--"] + cmd
            log = open(os.path.join(self.dir, "m%d.log" % member), "ab")
            self.procs[member] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                                  stdin=subprocess.DEVNULL)
            log.close()
        deadline = time.monotonic() + READY_TIMEOUT_S
        for member in ([i] if i is not None else range(len(self.procs))):
            while not self._healthy(member):
                if self.procs[member].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("etcd member m%d did not start" % member)
                time.sleep(0.1)  # polling another process's start-up: no event to wait on

    def _healthy(self, member):
        try:
            status, body = http_request("GET", self.endpoints[member] + "/health", timeout=2)
            return status == 200 and b"true" in body
        except OSError:
            return False

    def leader(self):
        """The index of the member that leads, asked of the live ones; None if none answers."""
        for member, endpoint in enumerate(self.endpoints):
            if self.procs[member] is None or self.procs[member].poll() is not None \
                    or member in self.frozen:
                continue
            try:
                status, body = http_request("POST", endpoint + "/v3/maintenance/status", "{}",
                                            timeout=2)
            except OSError:
                continue
            if status != 200:
                continue
            answer = json.loads(body)
            if answer.get("leader") and answer["leader"] == answer["header"]["member_id"]:
                return member
            leader_id = answer.get("leader")
            for other, other_endpoint in enumerate(self.endpoints):
                if other == member or other in self.frozen:
                    continue
                try:
                    status, body = http_request("POST", other_endpoint + "/v3/maintenance/status",
                                                "{}", timeout=2)
                except OSError:
                    continue
                if status == 200 and json.loads(body)["header"]["member_id"] == leader_id:
                    return other
        return None

    def kill(self, member):
        proc = self.procs[member]
        if proc is not None and proc.poll() is None:
            if member in self.frozen:
                os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait(timeout=30)
        self.frozen.discard(member)

    def freeze(self, member):
        os.kill(self.procs[member].pid, signal.SIGSTOP)
        self.frozen.add(member)

    def thaw(self, member):
        os.kill(self.procs[member].pid, signal.SIGCONT)
        self.frozen.discard(member)

    def close(self):
        for member in range(len(self.procs)):
            self.kill(member)
        shutil.rmtree(self.dir, ignore_errors=True)


# ------------------------------------------------------------------------------- processes
class NemesisNode(StorageNode):
    """A storage node on a fixed port of 127.0.0.1, registered at its proxy's address."""

    start_timeout_s = READY_TIMEOUT_S  # a start may wait out an etcd member's fault

    def __init__(self, etcd):
        self.port = _free_port_on_both(NODE_PROXY_HOST)
        self.listen = "127.0.0.1:%d" % self.port
        self.proxy = FaultProxy(NODE_PROXY_HOST, self.port, ("127.0.0.1", self.port))
        self.frozen = False
        self.extra_args = ["--advertised-address", NODE_PROXY_HOST,
                           "--lost-node-recovery-delay-seconds", str(LOST_NODE_RECOVERY_DELAY_S),
                           "--audit-interval-seconds", "2", "--refresh-seconds", "2",
                           "--gc-seconds", "10", "--min-free-mb", "0"]
        self.dir = scratch_dir("magnetar-nemesis-node-")
        self.log_path = os.path.join(self.dir, "node.log")
        self.metrics_url = "http://127.0.0.1:%d/metrics" % free_port()
        self.etcd = etcd
        self._start(self.listen)

    def start_again(self, wiped=False):
        """Starts the node again on its port: on its data, or on an emptied data directory (it
        comes back as a new node, the old one's copies lost)."""
        assert self.proc.poll() is not None, "still running"
        if wiped:
            shutil.rmtree(os.path.join(self.dir, "data"), ignore_errors=True)
        self._start(self.listen)

    def kill(self):
        if self.frozen and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
        self.frozen = False
        super().kill()

    def close(self):
        """Kills the node, keeping its directory and proxy (a failed start calls this: its log
        must outlive it); `dispose` removes them."""
        self.kill()

    def dispose(self):
        self.kill()
        self.proxy.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class Broker(conftest.Server):
    """`magnetar broker` reaching each etcd member through proxies of its own."""

    def __init__(self, etcd, config_path):
        super().__init__()
        self.frozen = False
        self.etcd_proxies = [FaultProxy("127.0.0.1", free_port(), ("127.0.0.1", port))
                             for port in etcd.client_ports]
        metadata = "etcd://" + ",".join(p.address for p in self.etcd_proxies)
        assert self.cmd[1] == "standalone", self.cmd
        self.cmd[1:2] = ["broker", "--metadata", metadata, "--cluster", CLUSTER,
                         "--config", str(config_path)]
        self.start_timeout = READY_TIMEOUT_S

    def kill(self):
        if self.frozen and self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
        self.frozen = False
        super().kill()

    def close(self):
        try:
            super().close()
        finally:
            for proxy in self.etcd_proxies:
                proxy.close()
            shutil.rmtree(self._tmp, ignore_errors=True)


BROKER_CONFIG = """
[ledgers]
storage = "nodes"
ensemble_size = %d
write_quorum = %d
ack_quorum = %d
add_timeout_millis = 2000

[metadata]
session_ttl_seconds = %d
""" % (ENSEMBLE, WRITE_QUORUM, ACK_QUORUM, SESSION_TTL_S)


class Cluster:
    """etcd, storage nodes and brokers as the module docstring describes; `close` kills all."""

    def __init__(self, workdir):
        self.etcd = EtcdCluster()
        self.nodes, self.brokers = [], []
        try:
            self.etcd.start()
            done = run_magnetar(["metadata", "init", "--metadata", self.etcd.url,
                                 "--cluster", CLUSTER,
                                 "--web-service-url", "http://127.0.0.1:8080",
                                 "--broker-service-url", "pulsar://127.0.0.1:6650"])
            assert done.returncode == 0, done.stdout + done.stderr
            self.nodes = [NemesisNode(self.etcd) for _ in range(NODES)]
            config = os.path.join(workdir, "broker.toml")
            with open(config, "w") as f:
                f.write(BROKER_CONFIG)
            self.brokers = [Broker(self.etcd, config) for _ in range(BROKERS)]
            for broker in self.brokers:
                broker.start()
        except BaseException:
            self.close()
            raise

    def service_url(self):
        return "pulsar://" + ",".join(b.service_url[len("pulsar://"):] for b in self.brokers)

    def logs(self):
        """(name, path) of every process's log."""
        yield from (("broker-%d" % i, b.log_path) for i, b in enumerate(self.brokers))
        yield from (("node-%d" % i, n.log_path) for i, n in enumerate(self.nodes))
        yield from (("etcd-m%d" % i, os.path.join(self.etcd.dir, "m%d.log" % i))
                    for i in range(ETCD_MEMBERS))

    def close(self):
        for broker in self.brokers:
            broker.close()
        for node in self.nodes:
            node.dispose()
        self.etcd.close()


# ---------------------------------------------------------------------------------- schedule
Fault = collections.namedtuple("Fault", "lane at kind target duration")

STORAGE_FAULTS = [("node_kill", 4), ("node_stop", 3), ("node_cut", 2), ("node_stall", 2),
                  ("node_stall_answers", 2), ("node_slow", 2), ("node_wipe", 1)]
CONTROL_FAULTS = [("broker_kill", 4), ("broker_stop", 3), ("broker_etcd_cut", 2),
                  ("etcd_leader_kill", 2), ("etcd_leader_stop", 1)]


def schedule(seed, seconds):
    """The faults of a run, drawn from `seed` alone: per lane, one after the other, a gap of 1-4 s
    before each; a fault lasts 2-14 s (a kill or a freeze sometimes past the etcd lease or the
    lost-node recovery delay)."""
    rng = random.Random(seed)
    faults = []
    for lane, kinds, targets in (("storage", STORAGE_FAULTS, NODES),
                                 ("control", CONTROL_FAULTS, BROKERS)):
        names = [k for k, weight in kinds for _ in range(weight)]
        t = rng.uniform(2, 5)
        while True:
            kind = rng.choice(names)
            duration = round(rng.uniform(2, 14), 1)
            if t + duration > seconds:
                break
            faults.append(Fault(lane, round(t, 1), kind, rng.randrange(targets), duration))
            t += duration + rng.uniform(1, 4)
    return sorted(faults, key=lambda f: f.at)


def describe(fault):
    subject = ("node %d" % fault.target if fault.lane == "storage" and fault.kind != "node_wipe"
               else "node %d" % fault.target if fault.lane == "storage"
               else "the etcd leader" if fault.kind.startswith("etcd")
               else "broker %d" % fault.target)
    return "+%6.1fs %-7s %-18s %-15s for %4.1fs" % (fault.at, fault.lane, fault.kind, subject,
                                                    fault.duration)


class Nemesis:
    """Applies a schedule to a cluster: a thread per lane, each fault applied, held for its
    duration, then healed. What happened is in `log` and `counts`; a heal that fails (a process
    that does not come back) is in `errors`."""

    def __init__(self, cluster, faults, t0):
        self.cluster, self.faults, self.t0 = cluster, faults, t0
        self.log, self.errors = [], []
        self.counts = collections.Counter()
        self._stop = threading.Event()
        self.done = {lane: threading.Event() for lane in ("storage", "control")}

    def run(self):
        """Starts the lanes; `done[lane]` is set once a lane's last fault is healed."""
        for lane in self.done:
            threading.Thread(target=self._lane, args=(lane,), daemon=True).start()

    def wait_done(self, timeout_s):
        deadline = time.monotonic() + timeout_s
        return all(done.wait(max(0.0, deadline - time.monotonic())) for done in self.done.values())

    def stop(self):
        """Lets the lanes end: only once the cluster is closed, because a process started under
        `setpriv --pdeathsig` is killed when the thread that started it ends."""
        self._stop.set()

    def _start_node(self, node, wiped=False, attempts=3):
        """Starts `node` again; a start that fails is tried again (at most `attempts` in all),
        counted in `counts["node_start_failed"]`. A node still exits at start when a request
        of its session, or auto-recovery's first read, times out on a frozen etcd member
        (ARCHITECTURE.md, Known gaps): that is counted, not hidden."""
        for attempt in range(attempts):
            try:
                node.start_again(wiped=wiped and attempt == 0)
                return
            except (Exception, pytest.fail.Exception) as error:  # noqa: BLE001
                self.counts["node_start_failed"] += 1
                self._note("node start failed (attempt %d): %s" % (attempt + 1,
                                                                   str(error)[-300:]))
                if attempt + 1 == attempts:
                    raise

    def heal_all(self):
        """After the lanes: every path passes, nothing is frozen, and every process runs (one
        whose restart failed during the run is started again here)."""
        cluster = self.cluster
        for member in range(ETCD_MEMBERS):
            if member in cluster.etcd.frozen:
                cluster.etcd.thaw(member)
            if cluster.etcd.procs[member].poll() is not None:
                cluster.etcd.start(member)
        for node in cluster.nodes:
            node.proxy.set("pass")
            if node.proc.poll() is not None:
                self._note("node %d was down at the end: started again" % cluster.nodes.index(node))
                self._start_node(node)
            elif node.frozen:
                os.kill(node.proc.pid, signal.SIGCONT)
                node.frozen = False
        for broker in cluster.brokers:
            for proxy in broker.etcd_proxies:
                proxy.set("pass")
            if not broker.running():
                self._note("broker %d was down at the end: started again"
                           % cluster.brokers.index(broker))
                broker.start()
            elif broker.frozen:
                os.kill(broker.proc.pid, signal.SIGCONT)
                broker.frozen = False

    def _note(self, text):
        line = "%7.1fs %s" % (time.monotonic() - self.t0, text)
        self.log.append(line)
        print(line, flush=True)

    def _lane(self, lane):
        for fault in (f for f in self.faults if f.lane == lane):
            # The schedule's own clock: each fault starts at its offset from the run's start.
            if self._stop.wait(max(0.0, self.t0 + fault.at - time.monotonic())):
                return
            try:
                self._apply(fault)
            # A fault that cannot heal is a finding (pytest.fail's is no Exception subclass);
            # the lane goes on, and `heal_all` tries again at the end.
            except (Exception, pytest.fail.Exception) as error:  # noqa: BLE001
                self.errors.append("%s: %s" % (describe(fault), str(error)[:2000]))
                self._note("FAILED %s: %s" % (describe(fault), str(error)[:2000]))
        self.done[lane].set()
        self._stop.wait()  # the processes this thread restarted live as long as it does

    def _apply(self, fault):
        cluster = self.cluster
        kind, hold = fault.kind, fault.duration
        if kind.startswith("node_"):
            node = cluster.nodes[fault.target]
            if kind == "node_wipe" and keys_in_etcd(cluster.etcd, "/autorecovery/under-replicated/"):
                # A second disk lost before the first one's copies are restored is beyond what
                # replication promises: a wipe waits for a whole cluster, and is skipped here.
                self._note("skipped %s: ledgers still under-replicated" % describe(fault))
                self.counts["skipped"] += 1
                return
            self._note("apply   %s" % describe(fault))
            if kind in ("node_kill", "node_wipe"):
                node.kill()
                time.sleep(hold)  # the fault itself: down this long
                self._start_node(node, wiped=kind == "node_wipe")
            elif kind == "node_stop":
                _freeze_for(node, node.proc.pid, hold)
            else:
                mode = {"node_cut": "cut", "node_stall": "stall",
                        "node_stall_answers": "stall_answers", "node_slow": "slow"}[kind]
                node.proxy.set(mode, delay_s=random.Random(fault.at).uniform(0.02, 0.15))
                time.sleep(hold)  # the fault itself
                node.proxy.set("pass")
        elif kind.startswith("broker_"):
            broker = cluster.brokers[fault.target]
            self._note("apply   %s" % describe(fault))
            if kind == "broker_kill":
                broker.kill()
                time.sleep(hold)  # the fault itself
                broker.start()
            elif kind == "broker_stop":
                _freeze_for(broker, broker.proc.pid, hold)
            else:
                for proxy in broker.etcd_proxies:
                    proxy.set("cut")
                time.sleep(hold)  # the fault itself
                for proxy in broker.etcd_proxies:
                    proxy.set("pass")
        else:
            leader = cluster.etcd.leader()
            if leader is None:
                self._note("skipped %s: no etcd leader answers" % describe(fault))
                self.counts["skipped"] += 1
                return
            self._note("apply   %s (m%d)" % (describe(fault), leader))
            if kind == "etcd_leader_kill":
                cluster.etcd.kill(leader)
                time.sleep(hold)  # the fault itself
                cluster.etcd.start(leader)
            else:
                cluster.etcd.freeze(leader)
                time.sleep(hold)  # the fault itself
                cluster.etcd.thaw(leader)
        self.counts[kind] += 1
        self._note("healed  %s" % describe(fault))


def _freeze_for(process, pid, hold):
    """SIGSTOPs `pid` for `hold` seconds, with `process.frozen` set meanwhile (a kill on the
    way out thaws a frozen process first)."""
    os.kill(pid, signal.SIGSTOP)
    process.frozen = True
    time.sleep(hold)  # the fault itself: frozen this long
    process.frozen = False
    os.kill(pid, signal.SIGCONT)


# ---------------------------------------------------------------------------------- workload
def quiet_logger():
    """The client's warnings and errors only: its info lines (every reconnection) run to
    hundreds of thousands over a run."""
    return pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn)


class TopicLoad:
    """One topic's producer and Failover consumer, and what each saw."""

    def __init__(self, service_url, topic, index):
        self.topic, self.index = topic, index
        self.acked, self.failed, self.pending = set(), {}, set()
        self.first_deliveries, self.deliveries, self.consume_errors = [], 0, []
        self.seen = set()
        self.sent = 0
        self._lock = threading.Lock()
        self._stop_producing = threading.Event()
        self._stop_consuming = threading.Event()
        self.client = pulsar.Client(service_url, operation_timeout_seconds=30, logger=quiet_logger())
        self.consumer = self.client.subscribe(
            topic, "nemesis", consumer_type=pulsar.ConsumerType.Failover,
            initial_position=pulsar.InitialPosition.Earliest)
        self.producer = self.client.create_producer(
            topic, producer_name="nemesis-%d" % index, batching_enabled=index % 2 == 1,
            batching_max_publish_delay_ms=5, send_timeout_millis=SEND_TIMEOUT_MS,
            max_pending_messages=2000, block_if_queue_full=True)
        self.threads = [threading.Thread(target=self._produce, daemon=True),
                        threading.Thread(target=self._consume, daemon=True)]
        for thread in self.threads:
            thread.start()

    def _produce(self):
        seq, start = 0, time.monotonic()
        while not self._stop_producing.is_set():
            # Pacing, not synchronisation: RATE_PER_TOPIC sends a second.
            wait = start + seq / RATE_PER_TOPIC - time.monotonic()
            if wait > 0 and self._stop_producing.wait(wait):
                break
            with self._lock:
                self.pending.add(seq)
            self.producer.send_async(b"%d" % seq, self._sent_callback(seq), sequence_id=seq)
            self.sent += 1
            seq += 1

    def _sent_callback(self, seq):
        def done(result, _message_id):
            with self._lock:
                self.pending.discard(seq)
                if result == pulsar.Result.Ok:
                    self.acked.add(seq)
                else:
                    self.failed[seq] = str(result)
        return done

    def _consume(self):
        while not self._stop_consuming.is_set():
            try:
                message = self.consumer.receive(timeout_millis=500)
            except pulsar.Timeout:
                continue
            except Exception as error:  # noqa: BLE001: every error is a finding
                self.consume_errors.append(repr(error))
                time.sleep(0.5)  # back off before asking the client again
                continue
            seq = int(message.data())
            with self._lock:
                self.deliveries += 1
                if seq not in self.seen:
                    self.seen.add(seq)
                    self.first_deliveries.append(seq)
            try:
                self.consumer.acknowledge(message)
            except Exception as error:  # noqa: BLE001
                self.consume_errors.append(repr(error))

    def stop_producing(self, timeout_s):
        """Stops sending and waits (bounded) for every pending send's outcome."""
        self._stop_producing.set()
        self.threads[0].join(timeout_s)
        deadline = time.monotonic() + timeout_s
        while self.pending and time.monotonic() < deadline:
            time.sleep(0.1)  # the client's callbacks have no event to join on
        return not self.pending

    def consumed_everything_acked(self):
        with self._lock:
            return self.acked <= self.seen

    def close(self):
        self._stop_consuming.set()
        self.threads[1].join(10)
        self.client.close()


def stored_sequence(service_url, topic, timeout_s=120):
    """Every message of `topic` from the earliest, in the order stored (a reader)."""
    client = pulsar.Client(service_url, operation_timeout_seconds=30, logger=quiet_logger())
    try:
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        stored, deadline = [], time.monotonic() + timeout_s
        while reader.has_message_available():
            assert time.monotonic() < deadline, "reading %s back took over %d s" % (topic,
                                                                                   timeout_s)
            stored.append(int(reader.read_next(timeout_millis=30_000).data()))
        return stored
    finally:
        client.close()


# ------------------------------------------------------------------------------------ checker
def check_topic(acked, stored, first_deliveries):
    """What the queue checker found on one topic: `acked` the sequence ids the producer was told
    were stored, `stored` the ids a reader reads back from the earliest (in order), and
    `first_deliveries` the ids the subscription delivered, each at its first delivery. Returns
    {finding: examples}; empty when nothing is wrong."""
    findings = {}
    stored_set = set(stored)
    lost = sorted(set(acked) - stored_set)
    if lost:
        findings["lost"] = lost[:10]
    counts = collections.Counter(stored)
    duplicates = sorted(seq for seq, n in counts.items() if n > 1)
    if duplicates:
        findings["duplicates"] = duplicates[:10]
    unique = list(dict.fromkeys(stored))  # each id at its first place
    out_of_order = [(a, b) for a, b in zip(unique, unique[1:]) if b < a]
    if out_of_order:
        findings["out_of_order"] = out_of_order[:10]
    unconsumed = sorted(set(acked) - set(first_deliveries))
    if unconsumed:
        findings["not_consumed"] = unconsumed[:10]
    delivered_out_of_order = [(a, b) for a, b in zip(first_deliveries, first_deliveries[1:])
                              if b < a]
    if delivered_out_of_order:
        findings["delivered_out_of_order"] = delivered_out_of_order[:10]
    return findings


def check_ledgers(ledgers, registered):
    """Ledgers not whole, from `ledgers` ({id: metadata}, as etcd holds them) and the ids of
    the `registered` storage nodes: {"below_write_quorum": [(ledger, fragment, ensemble)]} for
    every fragment whose ensemble is not WRITE_QUORUM distinct registered nodes, and apart from
    it {"one_run_per_node": [...]}, the fragments no registered node can take: a storage node
    holds one run of a ledger's entries, so a node holding another fragment of that ledger is
    no replacement (the known gap of issue 48 that the nemesis measures, not a finding), and
    {"open": [...]}, those of ledgers still open (auto-recovery copies closed ledgers only)."""
    below, blocked, still_open = [], [], []
    for ledger, meta in sorted(ledgers.items()):
        holders = {node for fragment in meta["fragments"] for node in fragment["ensemble"]}
        short = [(ledger, index, fragment["ensemble"])
                 for index, fragment in enumerate(meta["fragments"])
                 if len(set(fragment["ensemble"])) != WRITE_QUORUM
                 or not set(fragment["ensemble"]) <= registered]
        if meta.get("state") != "CLOSED":
            # Its writer's to change: auto-recovery copies closed ledgers only (a ledger whose
            # close timed out on the unload stays open for its next owner).
            still_open.extend(short)
        elif len(short) <= len(registered - holders):
            below.extend(short)
        else:
            # Each fragment short of a node needs a node holding no run of the ledger yet, and
            # each such node can take one: the plan fails for the whole ledger.
            blocked.extend(short)
    return {name: found for name, found in (("below_write_quorum", below),
                                            ("one_run_per_node", blocked),
                                            ("open", still_open)) if found}


def ledgers_whole(etcd):
    """`check_ledgers` of the cluster as etcd holds it now."""
    registered = {int(key.rsplit("/", 1)[1]) for key in keys_in_etcd(etcd, "/storage-nodes/")
                  if key.rsplit("/", 1)[1].isdigit()}
    return check_ledgers(ledgers_in_etcd(etcd), registered)
