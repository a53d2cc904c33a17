"""Auto-recovery (issue 48): a storage node lost for good has its copies made again elsewhere,
without an operator.

etcd, four storage nodes (`--lost-node-recovery-delay-seconds 1`, rounds every second) and a
broker (ensemble 2, write and ack quorum 2). A topic's messages are written, the topic unloaded
(its ledger closed), and one node of the ledger's ensemble SIGKILLed: within the bound, the
cluster's auditor (elected through etcd) marks the ledger under-replicated, a worker copies the
lost node's fragment to a node that held none of it and swaps it into the ledger's metadata, and
the marker goes, and the nodes' /metrics show it. Then the other node of the original ensemble is SIGKILLed too: every message is
still read, from the copy auto-recovery made, through the same broker, which had the ledger's old
metadata cached (a closed ledger's read that fails on every replica it names re-reads it).

Skipped without etcd unless MAGNETAR_REQUIRE_ETCD=1; skipped on an external broker."""

import time
import urllib.request

import pulsar
import pytest

from replicated_util import (COMMAND_TIMEOUT_S, data_ledger_ensemble, keys_in_etcd,
                             kept_namespace, ledgers_in_etcd, read_all, replicated_cluster,
                             skip_unless_own_magnetar, unload)

pytestmark = pytest.mark.restarts_server

FAST = ["--lost-node-recovery-delay-seconds", "1", "--audit-interval-seconds", "1"]
RECOVERY_BOUND_S = 60
MESSAGES = 200


def _ensembles(meta):
    return [node for fragment in meta["fragments"] for node in fragment["ensemble"]]


def test_a_lost_nodes_copies_are_made_again_and_outlive_the_other_copy(tmp_path):
    skip_unless_own_magnetar()
    with replicated_cluster(tmp_path, nodes=4, node_args=FAST) as (etcd, nodes, start_broker):
        broker = start_broker("b")
        ns = kept_namespace(broker, "healing")
        topic = "persistent://%s/kept" % ns
        client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
        try:
            producer = client.create_producer(topic, batching_enabled=False)
            for i in range(MESSAGES):
                producer.send(b"m-%d" % i)
            ledger, ensemble = data_ledger_ensemble(etcd)
        finally:
            client.close()
        unload(broker, topic)
        assert ledgers_in_etcd(etcd)[ledger]["state"] == "CLOSED"
        read_all(broker, topic, MESSAGES)  # the broker reads the closed ledger: its metadata cached

        first, second = [next(n for n in nodes if n.id == node) for node in ensemble]
        first.kill()
        deadline = time.monotonic() + RECOVERY_BOUND_S
        while True:
            meta = ledgers_in_etcd(etcd)[ledger]
            if first.id not in _ensembles(meta):
                break
            assert time.monotonic() < deadline, "ledger %d still names the lost node %d: %s\n%s" % (
                ledger, first.id, meta, "\n".join(n.log_tail() for n in nodes if n is not first))
            time.sleep(0.2)  # polled: etcd's change is the only event, and we are not watching it
        assert meta["state"] == "CLOSED" and second.id in _ensembles(meta), meta
        replacement = next(n for n in _ensembles(meta) if n not in ensemble)
        assert replacement in {n.id for n in nodes if n not in (first, second)}, meta
        deadline = time.monotonic() + RECOVERY_BOUND_S
        # (The topic's open ledger may be marked too: open ledgers are their writers'.)
        marker = "/autorecovery/under-replicated/%d" % ledger
        while marker in keys_in_etcd(etcd, "/autorecovery/under-replicated/"):
            assert time.monotonic() < deadline, "the marker stays: %s" % keys_in_etcd(
                etcd, "/autorecovery/")
            time.sleep(0.2)  # polled, as above

        # Progress in the nodes' /metrics: one auditor, the ledger counted as re-replicated,
        # its entries as copied.
        live = [n for n in nodes if n is not first]
        assert sum(_metric(n, "magnetar_autorecovery_auditor") for n in live) == 1
        assert sum(_metric(n, "magnetar_autorecovery_rereplicated_ledgers_total")
                   for n in live) >= 1
        assert sum(_metric(n, "magnetar_autorecovery_copied_entries_total")
                   for n in live) >= MESSAGES

        # Only the copy auto-recovery made is left of the ledger's entries; the topic unloaded
        # so that the entries are read from storage again, not from the topic's cache.
        second.kill()
        unload(broker, topic)
        read_all(broker, topic, MESSAGES)


def _metric(node, name):
    """The sum of a node's samples of `name` in its /metrics."""
    with urllib.request.urlopen(node.metrics_url, timeout=COMMAND_TIMEOUT_S) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.split("{", 1)[0].split(" ", 1)[0] == name)
