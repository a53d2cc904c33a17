"""Replicated ledgers with real processes on loopback: etcd, three `magnetar storage` nodes and
`magnetar broker` with `[ledgers] storage = "nodes"` (ensemble 2, write quorum 2, ack quorum 2),
driven by the official Python client.

- A storage node of the topic's ledger is SIGKILLed mid-stream: publishing goes on after the
  ensemble change (recorded in etcd before any later entry is acknowledged), and every
  acknowledged message is consumed afterwards, in order.
- Both nodes of the topic's ledger are SIGKILLed (one of three left): sends wait; a new node
  joins and every one is acknowledged and consumed, in order, from a new ledger.
- A namespace's `persistence` policy (as `pulsar-admin namespaces set-persistence` sets it)
  picks the quorums of the ledgers of the topics it loads afterwards.
- Each node's `/metrics` (`--metrics-listen`) reads as a bookie's: after the official client's
  sends, the two nodes of the topic's ledger count at least that many successful adds and
  bytes under BookKeeper's names, with latency quantiles, and pass `promtool check metrics`.
- A producer with thousands of sends in flight crosses dozens of ledger rollovers: every
  receipt comes in send order (the next ledger's first entries, durable before the full
  ledger's last ones, wait for them), so the client never reconnects and resends, and the topic
  holds each message once, in order. The official Go and Java clients too (tests/go, build
  tag `replicated`; tests/java, ReplicatedRolloverTest).
- Chaos (seeded): nodes SIGKILLed and restarted on their data, or frozen, one after another
  for 12 s under load: nothing fails, every message is read back once, in order.
- The broker SIGKILLed and restarted three times under load: every send ends acknowledged and
  every message is read back (at least once, first copies in order).
- `topics unload` again and again while thousands of sends are in flight: every message is
  stored once, in order (the sends taken before an unload are answered before the producer
  is closed; later ones are left for the client to resend).
- Storage nodes serve TLS and require client certificates: the broker writes through them
  with its `[ledgers] tls_*` files, and its next process reads everything back.
- The broker is frozen (SIGSTOP) and another broker opens the topic: it recovers the frozen
  broker's ledger (closed in etcd at or above every acknowledged entry) and serves every
  message. The frozen broker, resumed (SIGCONT), is fenced (its ledger writer's adds are
  refused: `magnetar_ledger_client_fenced_writers_total`) and cannot lose what is
  acknowledged: whatever it acknowledges afterwards is read back too.

Every wait is bounded; only processes started here are signalled, by PID. Skipped without etcd
unless MAGNETAR_REQUIRE_ETCD=1; skipped on an external broker or another server command."""

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

import pulsar_wire as wire
import raw_frames
from compat_util import http_request, read_n, receive_n, unique_topic
from go_runner import BUILD_AND_RUN_TIMEOUT_S, needs_go, run_go_test
from java_runner import BUILD_AND_RUN_TIMEOUT_S as JAVA_BUILD_AND_RUN_TIMEOUT_S
from java_runner import needs_java, run_java_tests
from pulsar_admin import PulsarAdmin, requires_pulsar_admin
from replicated_util import (COMMAND_TIMEOUT_S, StorageNode, data_ledger_ensemble,
                             ledger_ids_allocated_since, ledgers_in_etcd, node_most_written_to,
                             open_ledgers, replicated_cluster, skip_unless_own_magnetar)
from tls_certs import Certs

pytestmark = pytest.mark.restarts_server

@pytest.fixture()
def cluster(tmp_path):
    skip_unless_own_magnetar()
    with replicated_cluster(tmp_path) as started:
        yield started


def _send_through(service_url, topic, payload, timeout_s=20):
    """Opens a producer and sends one message on raw frames; True if it was acknowledged (a
    SEND_RECEIPT), False if refused (an error, the producer closed, the connection dropped or
    nothing within the bound)."""
    with wire.RawConnection(service_url, timeout=timeout_s) as conn:
        try:
            conn.handshake()
            producer_name = conn.open_producer(topic)
        except (AssertionError, socket.timeout, wire.Closed):
            return False
        meta = wire.message_metadata(producer_name, 0, int(time.time() * 1000))
        conn.send(wire.payload_frame(wire.cmd_send(1, 0), meta, payload))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                type_, _fields = conn.read_frame(timeout=max(0.1, deadline - time.monotonic()))
            except (socket.timeout, wire.Closed):
                return False
            if type_ == wire.SEND_RECEIPT:
                return True
            if type_ in (wire.SEND_ERROR, raw_frames.CLOSE_PRODUCER, wire.ERROR):
                return False
        return False


def _all_answered_ok(answers, n, srv, context=""):
    """Waits (bounded) until all n sends are answered (the client's callbacks append (index,
    result, ...) to `answers` on its own thread: nothing to await) and asserts each was
    acknowledged."""
    deadline = time.monotonic() + COMMAND_TIMEOUT_S
    while len(answers) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    failed = [a for a in answers if a[1] != pulsar.Result.Ok]
    assert len(answers) == n and not failed, "%s%d of %d answered, failed %s\n%s" % (
        context, len(answers), n, failed[:5], srv.log_tail())


def _run_faults(faults, test_over):
    """Runs `faults()` on a thread that then lives until `test_over` is set: the processes it
    restarts die with the thread that started them (setpriv's parent-death signal is a
    thread's, not the process's). Returns an Event set once `faults()` has returned."""
    done = threading.Event()

    def run():
        try:
            faults()
        finally:
            done.set()
            test_over.wait(timeout=10 * COMMAND_TIMEOUT_S)

    threading.Thread(target=run, daemon=True).start()
    return done


def test_publishing_survives_a_storage_node_killed_mid_stream(cluster):
    etcd, nodes, start_broker = cluster
    srv = start_broker("a")
    topic = unique_topic("replicated")
    n, kill_at = 2000, 500
    client = srv.client()
    try:
        consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=30000,
                                          max_pending_messages=256, block_if_queue_full=True)
        for i in range(kill_at):
            producer.send(str(i).encode())
        data_ledger, ensemble = data_ledger_ensemble(etcd)
        victim = next(node for node in nodes if node.id in ensemble)
        results = {}

        def sent(i):
            return lambda result, _msg_id: results.__setitem__(i, result)

        for i in range(kill_at, n):
            if i == kill_at + 100:
                victim.kill()
            producer.send_async(str(i).encode(), sent(i))
        producer.flush()
        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        while len(results) < n - kill_at and time.monotonic() < deadline:
            time.sleep(0.05)  # the client's callbacks run on its own thread: nothing to await
        failed = {i: r for i, r in results.items() if r != pulsar.Result.Ok}
        assert len(results) == n - kill_at and not failed, \
            "every send acknowledged; failed: %s\n%s" % (dict(list(failed.items())[:5]),
                                                         srv.log_tail())

        after = ledgers_in_etcd(etcd)[data_ledger]
        print("after the kill:", after)
        assert len(after["fragments"]) >= 2, "an ensemble change was recorded: %s" % after
        assert victim.id not in after["fragments"][-1]["ensemble"], after

        got = receive_n(consumer, n)
        assert [int(m.data()) for m in got] == list(range(n)), "every message, in order, once"
    finally:
        client.close()


def _samples(body, name):
    """{labels text: value} of the samples of `name` (exactly that name) in an exposition."""
    out = {}
    for line in body.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) + 1:].rsplit("} ", 1)
            out[labels] = float(value)
    return out


def _broker_metric(srv, name):
    """The sum of the samples of `name` on the broker's /metrics."""
    status, body = http_request("GET", srv.web_url + "/metrics")
    assert status == 200, body[:200]
    return sum(_samples(body.decode(), name).values())


def test_a_storage_node_s_metrics_read_as_a_bookie_s(cluster):
    etcd, nodes, start_broker = cluster
    srv = start_broker("a")
    topic = unique_topic("replicated")
    n, payload = 200, b"x" * 100
    for node in nodes:  # a node's first scrape starts its first stats interval
        assert http_request("GET", node.metrics_url)[0] == 200
    client = srv.client()
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        for _ in range(n):
            producer.send(payload)
    finally:
        client.close()
    _data_ledger, ensemble = data_ledger_ensemble(etcd)
    for node in (node for node in nodes if node.id in ensemble):
        # Quantiles cover the last completed 1 s interval: scrape until one holds the sends.
        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        while True:
            status, body = http_request("GET", node.metrics_url)
            assert status == 200, (status, body[:300])
            body = body.decode()
            p50 = [v for labels, v in _samples(body, "bookkeeper_server_ADD_ENTRY").items()
                   if 'success="true",quantile="0.5"' in labels]
            if (p50 and p50[0] > 0) or time.monotonic() > deadline:
                break
            time.sleep(0.2)  # the stats interval passes on the node's clock: nothing to await
        assert p50 and 0 < p50[0] < 1000, "add p50 in ms over the last interval:\n%s" % body
        added = [v for labels, v in _samples(body, "bookkeeper_server_ADD_ENTRY_count").items()
                 if 'success="true"' in labels]
        assert added and added[0] >= n, "every send is an add on each node of the ensemble: %s" % added
        assert list(_samples(body, "bookie_SERVER_STATUS").values()) == [1.0]
        assert list(_samples(body, "bookie_WRITE_BYTES").values())[0] >= n * len(payload)
        assert list(_samples(body, "bookkeeper_server_ADD_ENTRY_IN_PROGRESS").values()) == [0.0]
        promtool = shutil.which("promtool")
        if promtool:
            r = subprocess.run([promtool, "check", "metrics"], input=body.encode(),
                               capture_output=True, timeout=COMMAND_TIMEOUT_S)
            assert r.returncode == 0, (r.stdout + r.stderr).decode()


def test_publishing_resumes_once_a_write_quorum_of_nodes_is_live_again(cluster):
    """Both nodes of the topic's ledger die, leaving one of three: no ledger can have its two
    copies, so sends wait (the client resends them) while the broker replaces failed ledgers
    with a growing back-off. A new node joins: every message sent meanwhile is acknowledged,
    then consumed in order."""
    etcd, nodes, start_broker = cluster
    srv = start_broker("a")
    topic = unique_topic("resume")
    n, before_kill = 300, 100
    client = srv.client()
    try:
        consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=120000,
                                          max_pending_messages=256, block_if_queue_full=True)
        for i in range(before_kill):
            producer.send(str(i).encode())
        # Consumed now: their ledger's two copies are about to go.
        for m in receive_n(consumer, before_kill):
            consumer.acknowledge(m)
        _, ensemble = data_ledger_ensemble(etcd)
        for node in nodes:
            if node.id in ensemble:
                node.kill()
        results = {}

        def sent(i):
            return lambda result, _msg_id: results.__setitem__(i, result)

        for i in range(before_kill, n):
            producer.send_async(str(i).encode(), sent(i))
        # The broker finds its ledger failed and rolls over (to ledgers that fail in turn).
        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        while "ledger failed: rolling over" not in srv.log_tail():
            assert time.monotonic() < deadline, "the ledger never failed\n" + srv.log_tail()
            time.sleep(0.1)  # another process's log: no event to wait on
        assert not any(r == pulsar.Result.Ok for r in results.values()), \
            "acknowledged with one live node: %s" % results
        nodes.append(StorageNode(etcd))
        deadline = time.monotonic() + 2 * COMMAND_TIMEOUT_S
        while len(results) < n - before_kill and time.monotonic() < deadline:
            time.sleep(0.05)  # the client's callbacks run on its own thread: nothing to await
        failed = {i: r for i, r in results.items() if r != pulsar.Result.Ok}
        assert len(results) == n - before_kill and not failed, \
            "every send acknowledged once a quorum is back: %d of %d answered, failed %s\n%s" % (
                len(results), n - before_kill, dict(list(failed.items())[:5]), srv.log_tail())
        got = receive_n(consumer, n - before_kill)
        assert [int(m.data()) for m in got] == list(range(before_kill, n)), "in order, once"
    finally:
        client.close()


def test_receipts_come_in_send_order_across_rollovers_and_nothing_is_stored_twice(cluster):
    etcd, _nodes, start_broker = cluster
    per_ledger = 100
    srv = start_broker("a", "[broker]\nmax_entries_per_ledger = %d\n" % per_ledger)
    ledgers_before = set(ledgers_in_etcd(etcd))
    topic = unique_topic("rollovers")
    n = 5000
    client = srv.client()
    try:
        producer = client.create_producer(topic, batching_enabled=False,
                                          max_pending_messages=2000, block_if_queue_full=True)
        answers = []
        for i in range(n):
            producer.send_async(str(i).encode(),
                                lambda result, msg_id, i=i: answers.append((i, result, msg_id)))
        producer.flush()
        _all_answered_ok(answers, n, srv)
        assert [i for i, _, _ in answers] == list(range(n)), "answered in send order"
        positions = [(m.ledger_id(), m.entry_id()) for _, _, m in answers]
        assert all(a < b for a, b in zip(positions, positions[1:])), \
            "stored in send order: %s" % [(a, b) for a, b in zip(positions, positions[1:])
                                          if a >= b][:5]
        consumer = client.subscribe(topic, "all", initial_position=pulsar.InitialPosition.Earliest)
        got = [int(m.data()) for m in receive_n(consumer, n)]
        assert got == list(range(n)), "every message once, in order"
        with pytest.raises(pulsar.Timeout):
            consumer.receive(timeout_millis=1000)  # and nothing more: no resent duplicates
    finally:
        client.close()
    rolled = len({p[0] for p in positions})
    assert rolled >= n // per_ledger, "the sends crossed %d ledgers" % rolled
    assert len(set(ledgers_in_etcd(etcd)) - ledgers_before) >= rolled


def test_nodes_killed_and_frozen_over_and_over_lose_nothing_acknowledged(cluster):
    """Chaos, seeded (printed; MAGNETAR_CHAOS_SEED replays the schedule): while a producer
    keeps up to 500 sends in flight for 12 s, every 0.4-1.2 s a node is SIGKILLed and started
    again on its data 0.2-0.8 s later (the node most open ledgers are written to, so that
    writers must replace it: a spare's death changes nothing), or one of the three is frozen
    (SIGSTOP) for 0.2-0.8 s. Two nodes are always live or back soon, so no send fails: every
    one is acknowledged, and every message is read back in order, once. The broker counted
    the ensemble changes."""
    etcd, nodes, start_broker = cluster
    seed = int(os.environ.get("MAGNETAR_CHAOS_SEED") or time.time_ns() % 1000000)
    print("chaos seed", seed)
    rnd = random.Random(seed)
    srv = start_broker("a", "[broker]\nmax_entries_per_ledger = 5000\n")
    topic = unique_topic("chaos")
    client = srv.client()
    chaos_over, test_over = threading.Event(), threading.Event()
    try:
        client.subscribe(topic, "all", initial_position=pulsar.InitialPosition.Earliest).close()
        producer = client.create_producer(topic, batching_enabled=False, max_pending_messages=500,
                                          block_if_queue_full=True, send_timeout_millis=120000)
        answers = []
        actions = []

        def faults():
            while not chaos_over.wait(rnd.uniform(0.4, 1.2)):
                node = rnd.choice(nodes)
                pause = rnd.uniform(0.2, 0.8)
                if rnd.random() < 0.6:
                    node = node_most_written_to(etcd, nodes) or node
                    node.kill()
                    time.sleep(pause)  # the node stays down this long: the fault itself
                    node.restart()
                    actions.append(("kill", node.id))
                else:
                    os.kill(node.proc.pid, signal.SIGSTOP)
                    time.sleep(pause)  # frozen this long: the fault itself
                    os.kill(node.proc.pid, signal.SIGCONT)
                    actions.append(("freeze", node.id))

        faults_done = _run_faults(faults, test_over)
        n = 0
        try:
            started = time.monotonic()
            while time.monotonic() - started < 12:
                producer.send_async(str(n).encode(),
                                    lambda result, _id, i=n: answers.append((i, result)))
                n += 1
        finally:
            chaos_over.set()
        assert faults_done.wait(timeout=COMMAND_TIMEOUT_S), "the last fault did not end"
        producer.flush()
        _all_answered_ok(answers, n, srv, "seed %d: " % seed)
        assert len(actions) >= 5, "seed %d: only %s" % (seed, actions)
        consumer = client.subscribe(topic, "all", receiver_queue_size=2000)
        got = [int(m.data()) for m in receive_n(consumer, n)]
        assert got == list(range(n)), "seed %d: every message once, in order" % seed
        with pytest.raises(pulsar.Timeout):
            consumer.receive(timeout_millis=1000)
    finally:
        client.close()
        test_over.set()
    changes = _broker_metric(srv, "magnetar_ledger_client_ensemble_changes_total")
    assert changes >= 1, "seed %d: no ensemble change after %s" % (seed, actions)
    fragments = [meta for meta in ledgers_in_etcd(etcd).values() if len(meta["fragments"]) > 1]
    print("seed %d: %d messages, %d faults %s, %d ensemble changes, %d ledgers with fragments"
          % (seed, n, len(actions), actions, changes, len(fragments)))


def test_a_broker_killed_again_and_again_loses_nothing_acknowledged(cluster):
    """The broker is SIGKILLed and started again three times while a producer keeps up to 500
    sends in flight: each new broker process recovers the topic's open ledger from the nodes
    (fenced, closed at or above every acknowledged entry) and the client resends what was
    unanswered. Every send ends acknowledged and every acknowledged message is read back, the
    first copies in send order (a message whose receipt died with the broker may be stored
    twice: at least once, as with Pulsar)."""
    _etcd, _nodes, start_broker = cluster
    srv = start_broker("a", "[broker]\nmax_entries_per_ledger = 5000\n")
    topic = unique_topic("broker-kills")
    client = srv.client()
    test_over = threading.Event()
    try:
        client.subscribe(topic, "all", initial_position=pulsar.InitialPosition.Earliest).close()
        producer = client.create_producer(topic, batching_enabled=False, max_pending_messages=500,
                                          block_if_queue_full=True, send_timeout_millis=120000)
        answers = []
        kills = []

        def kill_three_times():
            for _ in range(3):
                time.sleep(2)  # pacing between faults, not synchronisation
                started = time.monotonic()
                srv.restart(graceful=False)
                kills.append(round(time.monotonic() - started, 2))

        kills_done = _run_faults(kill_three_times, test_over)
        n = 0
        while not kills_done.is_set():
            producer.send_async(str(n).encode(), lambda result, _id, i=n: answers.append((i, result)))
            n += 1
        for _ in range(1000):  # and some more on the last broker
            producer.send_async(str(n).encode(), lambda result, _id, i=n: answers.append((i, result)))
            n += 1
        producer.flush()
        _all_answered_ok(answers, n, srv)
        assert len(kills) == 3, kills
        consumer = client.subscribe(topic, "all", receiver_queue_size=2000)
        got = []
        while True:
            try:
                got.append(int(consumer.receive(timeout_millis=3000).data()))
            except pulsar.Timeout:
                break
        firsts, seen = [], set()
        for i in got:
            if i not in seen:
                seen.add(i)
                firsts.append(i)
        assert firsts == list(range(n)), "every acknowledged message read, first copies in order"
        print("%d messages over 3 broker kills (restarts took %s s): %d stored twice"
              % (n, kills, len(got) - n))
    finally:
        client.close()
        test_over.set()


def test_unloads_under_load_store_every_message_once(cluster):
    """`topics unload` while thousands of sends are in flight: the sends the broker took before
    the unload get their receipts ahead of CLOSE_PRODUCER, and the ones it did not take are
    left unanswered for the client to resend on its new producer. Before, the producer heard
    CLOSE_PRODUCER (or a send error, on which the client drops the connection) first, resent
    what was being stored, and the topic held hundreds of messages twice."""
    etcd, _nodes, start_broker = cluster
    srv = start_broker("a")
    topic = unique_topic("unload-under-load")
    unload_url = "%s/admin/v2/persistent/public/default/%s/unload" % (
        srv.web_url, topic.rsplit("/", 1)[1])
    n = 20000
    client = srv.client()
    try:
        client.subscribe(topic, "kept").close()  # a durable cursor, with a cursor ledger
        producer = client.create_producer(topic, batching_enabled=False,
                                          max_pending_messages=1000, block_if_queue_full=True,
                                          send_timeout_millis=60000)
        answers = []
        unloads = []
        sending = threading.Event()
        sending.set()

        def unloader():
            while sending.is_set():
                status, _body = http_request("PUT", unload_url, timeout=COMMAND_TIMEOUT_S)
                unloads.append(status)
                time.sleep(0.1)  # pacing, not synchronisation: sends go through in between

        thread = threading.Thread(target=unloader, daemon=True)
        thread.start()
        try:
            for i in range(n):
                producer.send_async(str(i).encode(),
                                    lambda result, msg_id, i=i: answers.append((i, result)))
            producer.flush()
        finally:
            sending.clear()
            thread.join(timeout=COMMAND_TIMEOUT_S)
        assert not thread.is_alive()
        _all_answered_ok(answers, n, srv)
        assert len(unloads) >= 3 and set(unloads) <= {200, 204}, unloads
        # Unloaded with nobody to load it again: it left none of its ledgers open (the next
        # owner reads their lengths instead of recovering them). The send first: the topic is
        # loaded (no re-creation after the last unload is still loading it).
        producer.send(str(n).encode())
        n += 1
        producer.close()
        status, _body = http_request("PUT", unload_url, timeout=COMMAND_TIMEOUT_S)
        assert status in (200, 204), status
        left_open = {lid: meta for lid, meta in ledgers_in_etcd(etcd).items() if meta["state"] != "CLOSED"}
        assert not left_open, "ledgers left open by the unload: %s" % left_open
        consumer = client.subscribe(topic, "all", initial_position=pulsar.InitialPosition.Earliest)
        got = [int(m.data()) for m in receive_n(consumer, n)]
        twice = sorted(i for i in set(got) if got.count(i) > 1) if len(set(got)) < n else []
        assert got == list(range(n)), "every message once, in order (%d unloads); twice: %s" % (
            len(unloads), twice[:10])
        with pytest.raises(pulsar.Timeout):
            consumer.receive(timeout_millis=1000)  # and nothing more: no resent duplicates
    finally:
        client.close()


@needs_go
@pytest.mark.timeout(BUILD_AND_RUN_TIMEOUT_S + 120)
def test_go_client_receipts_come_in_send_order_across_rollovers(cluster):
    """The same with the official Go client (tests/go/replicated_rollover_test.go): it too
    closes the connection and resends on a receipt out of order."""
    etcd, _nodes, start_broker = cluster
    per_ledger = 100
    srv = start_broker("a", "[broker]\nmax_entries_per_ledger = %d\n" % per_ledger)
    ledgers_before = set(ledgers_in_etcd(etcd))
    out = run_go_test("replicated", "TestReceiptsInOrderAcrossRollovers", {
        "MAGNETAR_TEST_SERVICE_URL": srv.service_url,
        "MAGNETAR_TEST_WEB_URL": srv.web_url,
        "MAGNETAR_TEST_ENTRIES_PER_LEDGER": str(per_ledger),
    })
    assert "answered and stored in order, each once" in out, out[-3000:]
    # It acknowledges what it reads: consumed ledgers may be trimmed already.
    assert ledger_ids_allocated_since(etcd, ledgers_before) >= 5000 // per_ledger, \
        "the sends crossed ledgers replicated on the nodes"


@needs_java
@pytest.mark.timeout(JAVA_BUILD_AND_RUN_TIMEOUT_S + 120)
def test_java_client_receipts_come_in_send_order_across_rollovers(cluster):
    """The same with the official Java client (tests/java, ReplicatedRolloverTest)."""
    etcd, _nodes, start_broker = cluster
    per_ledger = 100
    srv = start_broker("a", "[broker]\nmax_entries_per_ledger = %d\n" % per_ledger)
    ledgers_before = set(ledgers_in_etcd(etcd))
    passed = run_java_tests({"MAGNETAR_TEST_SERVICE_URL": srv.service_url,
                             "MAGNETAR_TEST_WEB_URL": srv.web_url,
                             "MAGNETAR_TEST_ENTRIES_PER_LEDGER": str(per_ledger)},
                            "ReplicatedRolloverTest")
    assert passed == ["ReplicatedRolloverTest.receiptsComeInSendOrderAcrossRolloversAndNothingIsStoredTwice"], passed
    assert ledger_ids_allocated_since(etcd, ledgers_before) >= 5000 // per_ledger, \
        "the sends crossed ledgers replicated on the nodes"


def _lookup_at(broker, topic):
    """The broker URL `broker`'s HTTP lookup gives for `topic` (None when it fails)."""
    status, body = http_request("GET", "%s/lookup/v2/topic/%s"
                                % (broker.web_url, topic.replace("://", "/")))
    return json.loads(body)["brokerUrl"] if status == 200 else None


def test_a_frozen_broker_s_ledger_is_recovered_by_another_and_nothing_acked_is_lost(cluster):
    etcd, _nodes, start_broker = cluster
    a = start_broker("a")
    topic = unique_topic("takeover")
    n = 300
    client_a = a.client()
    try:
        producer_a = client_a.create_producer(topic, batching_enabled=False)
        for i in range(n):
            producer_a.send(str(i).encode())
    finally:
        client_a.close()
    acked = list(range(n))
    ledgers_before = set(open_ledgers(etcd))
    assert ledgers_before, "broker a's ledgers are open in etcd"

    os.kill(a.proc.pid, signal.SIGSTOP)  # frozen mid-life: its ledger writers stay open
    b = start_broker("b")
    client_b = b.client()
    try:
        # b answers lookups with the owner, a, until its probes find a silent (about 2 s of
        # missed probes): a subscribe that went to the frozen a fails its connection, and the
        # application retries, as it would against Pulsar (which waits for a's session instead).
        deadline = time.monotonic() + 60
        while True:
            try:
                consumer = client_b.subscribe(topic, "after-takeover",
                                              initial_position=pulsar.InitialPosition.Earliest)
                break
            except pulsar.ConnectError:
                assert time.monotonic() < deadline, \
                    "broker b did not take the topic over:\n" + b.log_tail()
        got = receive_n(consumer, n)
        assert [int(m.data()) for m in got] == acked, "broker b serves everything a acked"
        ledgers = ledgers_in_etcd(etcd)
        recovered = [ledgers[lid] for lid in ledgers_before if lid in ledgers]
        assert recovered, (ledgers_before, ledgers)
        for meta in recovered:
            assert meta["state"] == "CLOSED", meta
            assert meta["epoch"] >= 1, "closed by a recovery, not by its writer: %s" % meta
        data = max(recovered, key=lambda m: m["last_entry_id"] if m["last_entry_id"] is not None
                   else -1)
        assert data["last_entry_id"] >= n - 1, \
            "closed at or above every acknowledged entry: %s" % data

        # Resumed, the old broker may still think it writes the topic until it reads that b
        # owns the bundle now. A send through it is refused (it no longer serves the topic, or
        # its ledger writer is fenced: the nodes refuse its adds) or, if acknowledged at all,
        # stored where every reader finds it. Raw frames, so that the wait is bounded (the C++
        # client resends on errors).
        os.kill(a.proc.pid, signal.SIGCONT)
        acked_late = _send_through(a.service_url, topic, b"late")
        print("late send through the resumed broker acknowledged:", acked_late, "; recovered:", data)
        deadline = time.monotonic() + 10
        while _broker_metric(a, "magnetar_ledger_client_fenced_writers_total") < 1 \
                and _lookup_at(a, topic) != b.service_url:
            assert time.monotonic() < deadline, \
                "the resumed broker neither was fenced nor gave the topic up:\n" + a.log_tail()
            time.sleep(0.05)  # polled: neither the fence nor the hand-over has an event here
        a.kill()
        reader = client_b.subscribe(topic, "check-%d" % time.monotonic_ns(),
                                    initial_position=pulsar.InitialPosition.Earliest)
        everything = receive_n(reader, n + (1 if acked_late else 0))
        values = [m.data() for m in everything]
        assert [int(v) for v in values[:n]] == acked
        if acked_late:
            assert values[n:] == [b"late"], values[n:]
    finally:
        client_b.close()


def test_a_namespace_persistence_policy_picks_the_quorums_of_new_ledgers(cluster):
    """`set-persistence` on a namespace (3/3/2 over the broker's 2/2/2): a loaded topic's
    next ledgers take it from its next rollover on (as Pulsar's), its cursor's too, and so do
    a new topic's; the ledgers made before keep their quorums."""
    etcd, _nodes, start_broker = cluster
    srv = start_broker("a", "[broker]\nmax_entries_per_ledger = 5\n")
    topic = unique_topic("persistence")
    client = srv.client()
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        # Seven: the first ledger full, two in the second, whose spare is not asked for yet
        # (at three), so no ledger is being created while the policy changes.
        for i in range(7):
            producer.send(str(i).encode())
        before = ledgers_in_etcd(etcd)
        policy = {"bookkeeperEnsemble": 3, "bookkeeperWriteQuorum": 3,
                  "bookkeeperAckQuorum": 2, "managedLedgerMaxMarkDeleteRate": 0}
        status, body = http_request(
            "POST", srv.web_url + "/admin/v2/namespaces/public/default/persistence",
            json.dumps(policy))
        assert status in (200, 204), (status, body)
        for i in range(7, 40):
            producer.send(str(i).encode())
        consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
        received = receive_n(consumer, 40)
        assert [int(m.data()) for m in received] == list(range(40))
        for message in received:
            consumer.acknowledge(message)
        other = client.create_producer(unique_topic("persistence-new"), batching_enabled=False)
        other.send(b"x")
    finally:
        client.close()
    assert before and all((m["write_quorum"], m["ack_quorum"]) == (2, 2)
                          for m in before.values()), before
    after = ledgers_in_etcd(etcd)
    new = {lid: meta for lid, meta in after.items() if lid not in before}
    assert len(new) >= 6, "rollovers of the loaded topic, its cursor's, the new topic's: %s" % new
    for meta in new.values():
        assert (meta["write_quorum"], meta["ack_quorum"]) == (3, 2), meta
        assert len(meta["fragments"][0]["ensemble"]) == 3, meta
    for lid, meta in before.items():
        if lid in after:
            assert after[lid]["write_quorum"] == 2, "a ledger keeps its quorums: %s" % meta


def _new_topic_ensembles(srv, etcd, namespace="public/default"):
    """Opens a new topic of `namespace` (a producer, a subscription, one message) and returns
    the ensembles of the ledgers that took: its data ledger, the spare made ready beside it,
    the cursor's."""
    before = set(ledgers_in_etcd(etcd))
    client = srv.client()
    try:
        topic = unique_topic("racks").replace("public/default", namespace)
        consumer = client.subscribe(topic, "sub")
        client.create_producer(topic, batching_enabled=False).send(b"placed")
        assert receive_n(consumer, 1)[0].data() == b"placed"
    finally:
        client.close()
    new = {lid: meta for lid, meta in ledgers_in_etcd(etcd).items() if lid not in before}
    assert new, "the topic's ledgers are in etcd"
    return [meta["fragments"][-1]["ensemble"] for meta in new.values()]


@requires_pulsar_admin
def test_pulsar_admin_bookies_lists_the_nodes_and_their_racks_spread_new_ledgers(cluster):
    """`pulsar-admin bookies`: list-bookies shows the registered storage nodes; racks set with
    set-bookie-rack read back with get-bookie-rack and racks-placement, and the broker places
    every new ledger's copies on different racks (the node placement used least before, alone
    on its rack, is now in every new ensemble); delete-bookie-rack removes one; bad racks are refused."""
    etcd, nodes, start_broker = cluster
    srv = start_broker("a")
    admin = PulsarAdmin(srv.web_url)
    listed = json.loads(admin("bookies", "list-bookies"))
    assert sorted(b["bookieId"] for b in listed["bookies"]) == sorted(n.address for n in nodes)
    assert json.loads(admin("bookies", "racks-placement")) == {}, "no racks assigned yet"

    # The node placement used least so far (by free disk, ties to the lower id: usually one
    # no ledger got) goes alone on a rack of its own.
    used = collections.Counter(node for ensemble in _new_topic_ensembles(srv, etcd)
                               for node in ensemble)
    alone = min(nodes, key=lambda n: (used[n.id], n.id))
    together = [n for n in nodes if n is not alone]
    for node in together:
        admin("bookies", "set-bookie-rack", "-b", node.address, "-r", "/rack-1")
    admin("bookies", "set-bookie-rack", "-b", alone.address, "-r", "rack-2", "-g", "edge",
          "--hostname", "127.0.0.1")
    assert json.loads(admin("bookies", "get-bookie-rack", "-b", alone.address)) == {
        "rack": "rack-2", "hostname": "127.0.0.1"}
    assert json.loads(admin("bookies", "racks-placement")) == {
        "default": {n.address: {"rack": "/rack-1"} for n in together},
        "edge": {alone.address: {"rack": "rack-2", "hostname": "127.0.0.1"}}}

    deadline = time.monotonic() + COMMAND_TIMEOUT_S
    while _broker_metric(srv, "magnetar_ledger_client_storage_node_racks") != 2:
        assert time.monotonic() < deadline, "the broker never saw the two racks"
        time.sleep(0.05)  # another process applies its watch: nothing to await here
    for ensemble in _new_topic_ensembles(srv, etcd):
        assert alone.id in ensemble, "a copy on each rack: %s, alone %d" % (ensemble, alone.id)

    admin("bookies", "delete-bookie-rack", "-b", alone.address)
    gone = admin.run("bookies", "get-bookie-rack", "-b", alone.address)
    assert gone.returncode != 0 and "not found" in (gone.stdout + gone.stderr).lower(), gone
    for rack in ["/region-1/rack-1", "/"]:
        refused = admin.run("bookies", "set-bookie-rack", "-b", alone.address, "-r", rack)
        assert refused.returncode != 0, (rack, refused)
    status, body = http_request("POST", srv.web_url + "/admin/v2/bookies/racks-info/h:1",
                                json.dumps({"rack": "r"}))
    assert status == 412 and b"group" in body, (status, body)
    status, body = http_request("POST", srv.web_url +
                                "/admin/v2/bookies/racks-info/h:1?group=g", "{not json")
    assert status == 400, (status, body)
    status, body = http_request("POST", srv.web_url +
                                "/admin/v2/bookies/racks-info/h:1?group=g",
                                json.dumps({"rack": "/a/b"}))
    assert status == 412 and b"slash" in body, (status, body)


@requires_pulsar_admin
def test_a_namespace_bookie_affinity_keeps_its_ledgers_to_its_groups(cluster):
    """`pulsar-admin namespaces set-bookie-affinity-group` over groups of `set-bookie-rack`
    (Pulsar's IsolatedBookieEnsemblePlacementPolicy), each node in a group of its own: a
    namespace whose primary groups have enough nodes gets only those; one whose primary group
    is too small gets its secondary group's too, and never a third group's; one with neither
    enough nor any node of no group gets no ledger (rather than copies on another group's
    nodes): its producers get a PersistenceError saying why, which clients retry, and the
    broker logs it. A broker's `[ledgers] isolation_groups` hold where no namespace says."""
    etcd, nodes, start_broker = cluster
    srv = start_broker("a")
    admin = PulsarAdmin(srv.web_url)
    for i, node in enumerate(nodes):
        admin("bookies", "set-bookie-rack", "-b", node.address, "-r", "rack-%d" % i,
              "-g", "g%d" % i)
    for namespace, groups in [("public/iso-two", ["--primary-group", "g0,g2"]),
                              ("public/iso-secondary", ["--primary-group", "g0",
                                                        "--secondary-group", "g1"]),
                              ("public/iso-strict", ["--primary-group", "g0"])]:
        admin("namespaces", "create", namespace)
        admin("namespaces", "set-bookie-affinity-group", namespace, *groups)
    assert json.loads(admin("namespaces", "get-bookie-affinity-group", "public/iso-secondary")) \
        == {"bookkeeperAffinityGroupPrimary": "g0", "bookkeeperAffinityGroupSecondary": "g1"}
    deadline = time.monotonic() + COMMAND_TIMEOUT_S
    while _broker_metric(srv, "magnetar_ledger_client_storage_node_racks") != 3:
        assert time.monotonic() < deadline, "the broker never saw the three racks"
        time.sleep(0.05)  # another process applies its watch: nothing to await here

    for namespace, members in [("public/iso-two", [nodes[0], nodes[2]]),
                               ("public/iso-secondary", [nodes[0], nodes[1]])]:
        want = sorted(n.id for n in members)
        for ensemble in _new_topic_ensembles(srv, etcd, namespace):
            assert sorted(ensemble) == want, (namespace, ensemble, want)

    before = set(ledgers_in_etcd(etcd))
    client = pulsar.Client(srv.service_url, operation_timeout_seconds=5)
    try:
        with pytest.raises(pulsar.Timeout):
            client.create_producer(unique_topic("strict").replace("public/default",
                                                                  "public/iso-strict"))
    finally:
        client.close()
    placed = [meta for lid, meta in ledgers_in_etcd(etcd).items() if lid not in before]
    assert not placed, "a ledger outside the namespace's groups: %s" % placed
    log = srv.log_tail()  # the client retried the broker's PersistenceError until its timeout
    assert "topic not loaded" in log and "bookie affinity allows" in log, log

    # A broker's own groups ([ledgers] isolation_groups, Pulsar's
    # bookkeeperClientIsolationGroups) hold for namespaces without an affinity of their own.
    srv.stop()
    other = start_broker("b", 'isolation_groups = "g1"\nsecondary_isolation_groups = "g2"\n')
    want = sorted(n.id for n in nodes[1:])
    for ensemble in _new_topic_ensembles(other, etcd):
        assert sorted(ensemble) == want, ("public/default", ensemble, want)
    for ensemble in _new_topic_ensembles(other, etcd, "public/iso-two"):
        assert sorted(ensemble) == sorted([nodes[0].id, nodes[2].id]), ensemble


def test_a_broker_writes_through_storage_nodes_that_serve_tls(tmp_path):
    """Storage nodes with `[tls]` on and client certificates required (their registrations
    say TLS), and a broker with `[ledgers] tls_trust_certs_file`, `tls_cert_file` and
    `tls_key_file`: the official client's messages are acknowledged, written at write quorum 2
    over TLS, also across a node of the ledger SIGKILLed mid-stream (the writer replaces it by
    the third node, over TLS too), and read back in order, also after the broker restarts (its
    next process reads the ledgers back from the nodes)."""
    skip_unless_own_magnetar()
    certs = Certs(str(tmp_path / "certs"))
    ca = certs.ca("cluster-ca")
    node = certs.leaf(ca, "storage-node")
    broker = certs.leaf(ca, "broker")
    node_toml = tmp_path / "node.toml"
    node_toml.write_text('[tls]\nenabled = true\ncert_file = "%s"\nkey_file = "%s"\n'
                         'trust_certs_file = "%s"\nrequire_trusted_client_cert = true\n'
                         % (node["cert"], node["key"], ca["cert"]))
    with replicated_cluster(tmp_path, nodes=3, node_args=["--config", str(node_toml)]) as (
            etcd, nodes, start_broker):
        srv = start_broker("a", 'tls_trust_certs_file = "%s"\ntls_cert_file = "%s"\n'
                                'tls_key_file = "%s"\n' % (ca["cert"], broker["cert"], broker["key"]))
        topic = unique_topic("tls-nodes")
        n = 300
        client = srv.client()
        try:
            consumer = client.subscribe(topic, "all")
            producer = client.create_producer(topic, batching_enabled=False,
                                              send_timeout_millis=30000)
            for i in range(n // 2):
                producer.send(b"%d" % i)
            ledger, ensemble = data_ledger_ensemble(etcd)
            assert len(ensemble) == 2, "written at write quorum 2: %s" % ensemble
            next(node for node in nodes if node.id == ensemble[0]).kill()
            for i in range(n // 2, n):
                producer.send(b"%d" % i)
            got = [int(m.data()) for m in receive_n(consumer, n)]
            assert got == list(range(n))
        finally:
            client.close()
        fragments = ledgers_in_etcd(etcd)[ledger]["fragments"]
        assert len(fragments) >= 2 and ensemble[0] not in fragments[-1]["ensemble"], fragments
        srv.restart(graceful=False)
        client = srv.client()
        try:
            reader = client.create_reader(topic, pulsar.MessageId.earliest)
            got = [int(m.data()) for m in read_n(reader, n)]
            assert got == list(range(n)), "read back from the TLS nodes by the next broker"
        finally:
            client.close()
