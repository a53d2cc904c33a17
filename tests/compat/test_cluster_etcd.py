"""Cluster mode: `magnetar metadata init` and `magnetar broker --metadata etcd://...` against an
etcd this test starts on loopback (data on /dev/shm), with the official Python client.

- metadata init creates the cluster's keys and a second run changes nothing;
- the broker on etcd serves produce / consume of 1,000 messages with a subscription; after a
  kill -9 (by PID) and a restart, acknowledged messages (a cumulative ack plus individual acks)
  are not redelivered and every unacknowledged one is;
- the admin API lists the topic, the cluster record, and the broker's registration in etcd
  (`GET /admin/v2/brokers/{cluster}`);
- two brokers on one etcd (over storage nodes): a namespace policy and a topic policy set
  through one broker's admin API reach a topic loaded on the other while its producer stays
  open (the policy watch);
- a broker with local ledgers keeps its cluster to itself: a second broker is refused;
- a broker whose cluster was never initialized, or whose etcd does not answer, exits non-zero
  in bounded time with one clear line and no panic.

Skipped without etcd unless MAGNETAR_REQUIRE_ETCD=1; skipped on an external broker or another
server command (these tests run magnetar itself)."""

import http.client
import json
import os
import shutil
import subprocess
import time
import urllib.parse

import pulsar
import pytest

import conftest
from compat_util import assert_nothing_more, http_request, receive_n, unique_topic
from etcd_util import Etcd
from replicated_util import replicated_cluster

pytestmark = pytest.mark.restarts_server

CLUSTER = "compat-cluster"
N = 1000
CUMULATIVE_UPTO = 499           # acknowledged cumulatively: 0..499
COMMAND_TIMEOUT_S = 60


def _skip_unless_own_magnetar():
    if os.environ.get("MAGNETAR_TEST_SERVICE_URL") or os.environ.get("MAGNETAR_TEST_SERVER_CMD"):
        pytest.skip("runs magnetar broker itself; an external broker or server command is set")


def _binary():
    binary = os.environ.get("MAGNETAR_BIN",
                            os.path.join(conftest.REPO_ROOT, "target", "release", "magnetar"))
    if not os.access(binary, os.X_OK):
        pytest.fail("%s not found: build it with `cargo build --release -p magnetar`" % binary)
    return binary


def _run(args, timeout=COMMAND_TIMEOUT_S):
    """Runs magnetar with args to its end (bounded); returns the CompletedProcess."""
    env = dict(os.environ, NO_COLOR="1")
    return subprocess.run([_binary()] + args, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env=env)


@pytest.fixture(scope="module")
def etcd():
    _skip_unless_own_magnetar()
    server = Etcd()
    try:
        server.start()
        yield server
    finally:
        server.close()


def _init(etcd, cluster, web_url, broker_url):
    done = _run(["metadata", "init", "--metadata", etcd.url, "--cluster", cluster,
                 "--web-service-url", web_url, "--broker-service-url", broker_url])
    assert done.returncode == 0, "metadata init failed:\n%s%s" % (done.stdout, done.stderr)
    return done.stdout


def _broker(etcd, cluster):
    """A conftest.Server running `magnetar broker` on etcd (not started yet)."""
    srv = conftest.Server()
    assert srv.cmd[1] == "standalone", srv.cmd
    srv.cmd[1:2] = ["broker", "--metadata", etcd.url, "--cluster", cluster]
    return srv


def test_metadata_init_then_broker_keeps_acks_across_kill9(etcd):
    srv = _broker(etcd, CLUSTER)
    web_url = "http://127.0.0.1:%d" % srv.web_port
    first = _init(etcd, CLUSTER, web_url, srv.service_url)
    assert first.count("\n  created ") == 5, first
    second = _init(etcd, CLUSTER, web_url, srv.service_url)
    assert "nothing changed" in second and second.count("\n  exists ") == 5, second

    topic = unique_topic("etcd")
    # Cumulative ack of 0..499, then individual acks of every third message after it.
    acked = set(range(CUMULATIVE_UPTO + 1)) | {i for i in range(CUMULATIVE_UPTO + 1, N)
                                                if i % 3 == 0}
    expected_again = [i for i in range(N) if i not in acked]
    try:
        srv.start()
        client = srv.client()
        try:
            consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Exclusive,
                                        initial_position=pulsar.InitialPosition.Earliest)
            producer = client.create_producer(topic, batching_enabled=False)
            for i in range(N):
                producer.send_async(str(i).encode(), None)
            producer.flush()
            got = receive_n(consumer, N)
            assert [int(m.data()) for m in got] == list(range(N)), "in order, each once"
            consumer.acknowledge_cumulative(got[CUMULATIVE_UPTO])
            for m in got[CUMULATIVE_UPTO + 1:]:
                if int(m.data()) in acked:
                    consumer.acknowledge(m)
            consumer.close()  # flushes the client's pending acks before it returns
        finally:
            client.close()

        srv.kill()  # kill -9, by PID
        srv.start()

        client = srv.client()
        try:
            consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Exclusive)
            again = receive_n(consumer, len(expected_again), what="unacknowledged message")
            assert [int(m.data()) for m in again] == expected_again, \
                "exactly the unacknowledged messages come back, in order"
            assert_nothing_more(consumer)
        finally:
            client.close()

        status, body = http_request("GET", srv.web_url + "/admin/v2/persistent/public/default")
        assert status == 200 and topic in json.loads(body), (status, body)
        status, body = http_request("GET", srv.web_url + "/admin/v2/brokers/" + CLUSTER)
        assert status == 200, (status, body)
        assert json.loads(body) == ["127.0.0.1:%d" % srv.web_port], \
            "the broker's registration key in etcd"
        status, body = http_request("GET", srv.web_url + "/admin/v2/clusters/" + CLUSTER)
        assert status == 200 and json.loads(body)["brokerServiceUrl"] == srv.service_url, body
        status, body = http_request("GET", srv.web_url + "/admin/v2/brokers/ready")
        assert (status, body) == (200, b"ok")
    finally:
        srv.close()
        shutil.rmtree(srv._tmp, ignore_errors=True)


def _is_dup_receipt(message_id):
    # Pulsar acknowledges a duplicate at once with message id -1:-1.
    return message_id.ledger_id() == -1 and message_id.entry_id() == -1


def _post_following_redirect(url, body):
    """POSTs `body` to `url`, again to the Location of a 307 (once)."""
    parsed = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
    try:
        connection.request("POST", parsed.path, body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        status, answer = response.status, response.read()
        location = response.getheader("Location")
    finally:
        connection.close()
    if status == 307 and location:
        return http_request("POST", location, body)
    return status, answer


def test_policies_set_through_one_broker_reach_a_topic_loaded_on_another(tmp_path):
    """Deduplication is the probe: a resent sequence id is stored while it is off and answered
    as a duplicate (-1:-1) while it is on, on the producer opened before the change (a new
    producer or consumer would re-read the policies anyway). Enabled for the namespace through
    broker B, then disabled for the topic through B: broker A, which has the topic loaded,
    follows both, each within the bounded wait. Two brokers share a cluster only over storage
    nodes (ledgers on one broker's disk are its alone)."""
    _skip_unless_own_magnetar()
    with replicated_cluster(tmp_path, nodes=2) as (_, _, start_broker):
        _policies_reach_the_loading_broker(start_broker("a"), start_broker("b"))


def _policies_reach_the_loading_broker(loader, other):
    namespace = "public/policy-watch-%d" % os.getpid()
    topic = "persistent://%s/%s" % (namespace, unique_topic("watched").rsplit("/", 1)[-1])
    client = None
    try:
        status, body = http_request("PUT", other.web_url + "/admin/v2/namespaces/" + namespace)
        assert status in (200, 204), (status, body)
        client = loader.client()
        producer = client.create_producer(topic, producer_name="p", batching_enabled=False)
        sequence = [10]

        def resent_is_duplicate():
            sequence[0] += 1
            producer.send(b"first", sequence_id=sequence[0])
            return _is_dup_receipt(producer.send(b"again", sequence_id=sequence[0]))

        def eventually(expected, what):
            deadline = time.monotonic() + 10
            while resent_is_duplicate() != expected:
                assert time.monotonic() < deadline, "%s: not applied on the loading broker " \
                    "within 10 s\n%s" % (what, loader.log_tail())
                time.sleep(0.05)  # polled: the client sees no event for a policy change

        assert not resent_is_duplicate(), "deduplication is off to begin with"
        status, body = http_request("POST", "%s/admin/v2/namespaces/%s/deduplication"
                                    % (other.web_url, namespace), "true")
        assert status in (200, 204), (status, body)
        eventually(True, "namespace deduplication enabled through the other broker")
        # A topic's own operations go to its owner: the other broker answers 307 there (as
        # Pulsar does), and the request is sent again where it points, as pulsar-admin does.
        url = "%s/admin/v2/%s/deduplicationEnabled" % (other.web_url, topic.replace("://", "/"))
        status, body = _post_following_redirect(url, "false")
        assert status in (200, 204), (status, body)
        eventually(False, "topic deduplication disabled through the other broker")
    finally:
        if client is not None:
            client.close()


def test_a_cluster_whose_ledgers_are_on_a_brokers_disk_takes_no_other_broker(etcd, tmp_path):
    """A broker with local ledgers claims its cluster: a second broker, with local ledgers or
    on storage nodes, exits with one line naming the first (a topic moved to it could not read
    the first's ledgers); the first, killed and started again on its data, takes the cluster
    back."""
    cluster = "local-claim"
    owner = _broker(etcd, cluster)
    _init(etcd, cluster, "http://127.0.0.1:%d" % owner.web_port, owner.service_url)
    nodes_config = tmp_path / "nodes.toml"
    nodes_config.write_text('[ledgers]\nstorage = "nodes"\n')
    try:
        owner.start()
        holder = "127.0.0.1:%d" % owner.web_port
        for extra, says in [([], "already has a broker (%s)" % holder),
                            (["--config", str(nodes_config)],
                             "keeps its ledgers on the disk of broker %s" % holder)]:
            data = tmp_path / ("data-%d" % len(extra))
            done = _run(["broker", "--metadata", etcd.url, "--cluster", cluster,
                         "--data-dir", str(data), "--broker-port", "0", "--web-port", "0"]
                        + extra)
            assert done.returncode != 0 and says in done.stderr, done.stderr
            assert done.stderr.strip().count("\n") == 0, "one line: %r" % done.stderr
            assert "panicked" not in done.stderr, done.stderr
        owner.restart(graceful=False)  # kill -9, by PID, and a start on the same data
        status, _ = http_request("GET", owner.web_url + "/admin/v2/brokers/health")
        assert status == 200
    finally:
        owner.close()
        shutil.rmtree(owner._tmp, ignore_errors=True)


def test_broker_refuses_an_uninitialized_cluster(etcd, tmp_path):
    started = time.monotonic()
    done = _run(["broker", "--metadata", etcd.url, "--cluster", "never-initialized",
                 "--data-dir", str(tmp_path / "data"), "--broker-port", "0", "--web-port", "0"])
    assert done.returncode != 0
    assert "magnetar metadata init" in done.stderr, done.stderr
    assert "panicked" not in done.stderr and "backtrace" not in done.stderr, done.stderr
    assert done.stderr.strip().count("\n") == 0, "one line: %r" % done.stderr
    assert time.monotonic() - started < 30
    assert not (tmp_path / "data").exists(), "nothing opened for a refused cluster"


def test_broker_with_nothing_listening_exits_with_one_line(tmp_path):
    _skip_unless_own_magnetar()
    started = time.monotonic()
    done = _run(["broker", "--metadata", "etcd://127.0.0.1:1", "--cluster", "c",
                 "--data-dir", str(tmp_path / "data")])
    elapsed = time.monotonic() - started
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot reach etcd at "
                                                    "http://127.0.0.1:1"), done.stderr
    assert "panicked" not in done.stderr and "backtrace" not in done.stderr
    assert elapsed < 30, "exited after %.1f s (bounded by the 10 s connect timeout)" % elapsed
    assert not (tmp_path / "data").exists(), "no data opened without etcd"
    bad = _run(["broker", "--metadata", "etcd://h:2379,,x", "--cluster", "c"])
    assert bad.returncode != 0 and "empty endpoint" in bad.stderr, bad.stderr
