"""Real replicated clusters on loopback for the tests: `magnetar storage` nodes registered in an
etcd of the test's own, `magnetar broker` with its ledgers on them, and the ledgers' metadata as
etcd holds it. Every process is killed by its PID; every wait is bounded."""

import collections
import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import urllib.request

import pulsar
import pytest

import conftest
from compat_util import free_port, http_request, read_n
from etcd_util import Etcd, scratch_dir

CLUSTER = "replicated"
START_TIMEOUT_S = 30
COMMAND_TIMEOUT_S = 60


def skip_unless_own_magnetar():
    if os.environ.get("MAGNETAR_TEST_SERVICE_URL") or os.environ.get("MAGNETAR_TEST_SERVER_CMD"):
        pytest.skip("runs magnetar itself; an external broker or server command is set")


class StorageNode:
    """A `magnetar storage` process registered in `etcd`; killed by PID when closed."""

    def __init__(self, etcd, extra_args=()):
        self.extra_args = list(extra_args)
        self.dir = scratch_dir("magnetar-storage-")
        self.log_path = os.path.join(self.dir, "node.log")
        self.metrics_url = "http://127.0.0.1:%d/metrics" % free_port()
        self.etcd = etcd
        self._start("127.0.0.1:0")

    def restart(self):
        """Starts the node again on its data and address (after `kill`)."""
        assert self.proc.poll() is not None, "still running"
        known = self.id
        self._start(self.address)
        assert self.id == known, "the node came back as %d, not %d" % (self.id, known)

    def _start(self, listen):
        etcd = self.etcd
        cmd = [conftest.magnetar_binary(), "storage", "--listen", listen,
               "--metadata", etcd.url, "--cluster", CLUSTER,
               "--data-dir", os.path.join(self.dir, "data"),
               "--metrics-listen", self.metrics_url.split("/")[2], "--stats-interval-seconds", "1"]
        cmd += self.extra_args
        if shutil.which("setpriv"):
            cmd = ["setpriv", "--pdeathsig", "KILL", "--"] + cmd
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log,
                                         stdin=subprocess.DEVNULL, env=dict(os.environ, NO_COLOR="1"))
        # Its first line, printed once registered and listening: "storage node ID listening on A".
        ready, _, _ = select.select([self.proc.stdout], [], [],
                                   getattr(self, "start_timeout_s", START_TIMEOUT_S))
        line = self.proc.stdout.readline().decode() if ready else ""
        if not line.startswith("storage node "):
            self.close()
            pytest.fail("storage node did not start: %r\n%s" % (line, self.log_tail()))
        self.id = int(line.split()[2])
        self.address = line.split()[-1]

    def log_tail(self, chars=3000):
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-chars:].decode(errors="replace")
        except OSError:
            return ""

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()  # SIGKILL, by PID
        self.proc.wait(timeout=COMMAND_TIMEOUT_S)

    def close(self):
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def run_magnetar(args):
    env = dict(os.environ, NO_COLOR="1")
    return subprocess.run([conftest.magnetar_binary()] + args, capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT_S, stdin=subprocess.DEVNULL, env=env)


def broker_server(etcd, tmp_path, name, extra_toml=""):
    """A conftest.Server running `magnetar broker` with its ledgers on the storage nodes.
    `extra_toml` is appended to its config file; a function of the server gives it (for settings
    that name the server's own ports)."""
    srv = conftest.Server()
    if callable(extra_toml):
        extra_toml = extra_toml(srv)
    config = tmp_path / ("%s.toml" % name)
    config.write_text('[ledgers]\nstorage = "nodes"\nensemble_size = 2\nwrite_quorum = 2\n'
                      'ack_quorum = 2\nadd_timeout_millis = 1000\n' + extra_toml)
    assert srv.cmd[1] == "standalone", srv.cmd
    srv.cmd[1:2] = ["broker", "--metadata", etcd.url, "--cluster", CLUSTER, "--config", str(config)]
    return srv


def ledgers_in_etcd(etcd):
    """Every replicated ledger's metadata in etcd: {ledger id: metadata}."""
    etcdctl = shutil.which("etcdctl")
    if not etcdctl:
        pytest.fail("etcdctl not found (apt-get install etcd-client)")
    done = subprocess.run([etcdctl, "--endpoints", etcd.endpoint, "get", "--prefix",
                           "/magnetar/%s/ledgers/" % CLUSTER], capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT_S, env=dict(os.environ, ETCDCTL_API="3"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    return {int(key.rsplit("/", 1)[1]): json.loads(value)
            for key, value in zip(lines[0::2], lines[1::2])}


def keys_in_etcd(etcd, path):
    """The cluster's keys under `path` (e.g. `/autorecovery/under-replicated/`), without the
    cluster's root."""
    etcdctl = shutil.which("etcdctl")
    if not etcdctl:
        pytest.fail("etcdctl not found (apt-get install etcd-client)")
    root = "/magnetar/%s" % CLUSTER
    done = subprocess.run([etcdctl, "--endpoints", etcd.endpoint, "get", "--prefix", "--keys-only",
                           root + path], capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT_S, env=dict(os.environ, ETCDCTL_API="3"))
    assert done.returncode == 0, done.stderr
    return [line[len(root):] for line in done.stdout.splitlines() if line.strip()]


def ledger_ids_allocated_since(etcd, before):
    """How many ledger ids were taken since the ledger ids `before` were listed: ids come from
    one cluster-wide counter, and a topic's newest ledger stays, while consumed ledgers may be
    trimmed (deleted) meanwhile, so the highest id tells what counting the listed ones cannot."""
    return max(set(ledgers_in_etcd(etcd)) | {-1}) - max(set(before) | {-1})


def open_ledgers(etcd):
    return {lid: meta for lid, meta in ledgers_in_etcd(etcd).items() if meta["state"] == "OPEN"}


def node_adds(node):
    """The normal adds a live storage node has taken (its `magnetar_storage_node_adds_total`)."""
    with urllib.request.urlopen(node.metrics_url, timeout=COMMAND_TIMEOUT_S) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("magnetar_storage_node_adds_total"))


def node_most_written_to(etcd, nodes):
    """Of `nodes`, the one in the most open ledgers' last ensembles (a topic's current ledger,
    its spare and its cursors' ledgers are open): killing it makes writers replace it, where
    killing a node no open ledger uses changes nothing. None when no open ledger is listed."""
    holders = collections.Counter(node for meta in open_ledgers(etcd).values()
                                  for node in meta["fragments"][-1]["ensemble"])
    return next((n for node_id, _ in holders.most_common() for n in nodes if n.id == node_id),
                None)


def data_ledger_ensemble(etcd):
    """The open data ledger of the (only) topic and its last fragment's nodes: cursor ledgers
    are open too; the data ledger is the one holding entries, so the first one created."""
    before = open_ledgers(etcd)
    assert before, "the topic's ledgers are in etcd"
    data_ledger = min(before)
    ensemble = before[data_ledger]["fragments"][-1]["ensemble"]
    assert len(ensemble) == 2, before[data_ledger]
    return data_ledger, ensemble


@contextlib.contextmanager
def replicated_cluster(tmp_path, nodes=3, node_args=()):
    """etcd with the cluster's metadata and `nodes` storage nodes (given `node_args`); yields
    (etcd, nodes, broker(name, extra_toml="")), which starts a broker on them (ensemble 2,
    write quorum 2, ack quorum 2). Everything is killed, by PID, on the way out."""
    etcd = Etcd()
    started, brokers = [], []
    try:
        etcd.start()
        done = run_magnetar(["metadata", "init", "--metadata", etcd.url, "--cluster", CLUSTER,
                             "--web-service-url", "http://127.0.0.1:8080",
                             "--broker-service-url", "pulsar://127.0.0.1:6650"])
        assert done.returncode == 0, done.stdout + done.stderr
        started.extend(StorageNode(etcd, node_args) for _ in range(nodes))

        def broker(name, extra_toml="", health_headers=None):
            srv = broker_server(etcd, tmp_path, name, extra_toml)
            srv.health_headers = health_headers  # credentials of a secured broker's health check
            brokers.append(srv)
            srv.start()
            return srv

        yield etcd, started, broker
    finally:
        for srv in brokers:
            if srv.proc is not None and srv.proc.poll() is None:
                os.kill(srv.proc.pid, signal.SIGCONT)  # a frozen broker must be able to die
            srv.close()
            _keep_log(srv.log_path, "broker-%d.log" % srv.web_port)
            shutil.rmtree(srv._tmp, ignore_errors=True)
        for node in started:
            node.kill()
            _keep_log(node.log_path, "node-%s.log" % os.path.basename(node.dir))
            node.close()
        etcd.close()


def _keep_log(path, name):
    """Copies a process's log into MAGNETAR_TEST_KEEP_LOGS (a directory) when that is set: the
    logs of a cluster test go with its scratch directories otherwise."""
    keep = os.environ.get("MAGNETAR_TEST_KEEP_LOGS")
    if keep and path and os.path.exists(path):
        os.makedirs(keep, exist_ok=True)
        shutil.copyfile(path, os.path.join(keep, name))


def kept_namespace(broker, name):
    """Creates namespace `public/<name>-<pid>` whose data is kept without a subscription (the
    retention pass would trim an unread closed ledger otherwise); returns its name."""
    ns = "public/%s-%d" % (name, os.getpid())
    status, body = http_request("PUT", broker.web_url + "/admin/v2/namespaces/" + ns)
    assert status in (200, 204), (status, body)
    status, body = http_request(
        "POST", "%s/admin/v2/namespaces/%s/retention" % (broker.web_url, ns),
        json.dumps({"retentionTimeInMinutes": 60, "retentionSizeInMB": 100}))
    assert status in (200, 204), (status, body)
    return ns


def unload(broker, topic):
    """Unloads `topic` through the admin API (its ledgers closed)."""
    status, body = http_request("PUT", "%s/admin/v2/%s/unload" % (
        broker.web_url, topic.replace("://", "/")))
    assert status in (200, 204), (status, body)


def read_all(broker, topic, count):
    """Reads `topic` from the earliest message with the Python client: exactly m-0 .. m-<count-1>."""
    client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
    try:
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        got = [m.data() for m in read_n(reader, count, timeout_ms=COMMAND_TIMEOUT_S * 1000)]
        assert got == [b"m-%d" % i for i in range(count)]
    finally:
        client.close()
