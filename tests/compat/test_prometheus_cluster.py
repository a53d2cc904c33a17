"""The storage nodes' dashboard (deploy/grafana/dashboards/magnetar-storage-nodes.json) and alert
rules (deploy/prometheus/alerts-storage-nodes.yml) against a real Prometheus scraping a
replicated cluster through a broker kill and a storage node kill.

The cluster: etcd, three `magnetar storage` nodes (job "magnetar-storage", their
--metrics-listen addresses, 1-second stats intervals) and `magnetar broker` with its ledgers on
them at ensemble 2, write quorum 2, ack quorum 2 (job "magnetar"); Prometheus scrapes and
evaluates every second. The load, with the official Python client (unbatched sends, a
subscription from the start):
1. messages sent and acknowledged; the broker SIGKILLed and started again: the topic's new
   broker process recovers the ledgers the dead one left open (a recovery, counted);
2. more messages; then the storage node that most open ledgers' ensembles hold is SIGKILLed
   and more messages sent and consumed: the writers replace it (ensemble changes, requests it
   left unanswered), and the consumer reads everything back from the nodes (node reads).
The waits poll Prometheus, bounded, until it has all of it at one evaluation time; every query
is evaluated at that time. Then:
- every query of the dashboard, for all nodes and for one live node: non-empty, finite, not
  negative, and the expected values (the write quorum 2; adds, ensemble changes, a closed
  recovery and its time positive; no failed recovery);
- its template variables list the cluster and the live nodes;
- every alert rule is loaded and healthy and each operand of its comparisons is non-empty and
  finite; `MagnetarStorageNodeDown` is pending or firing for the killed node (and no other),
  `MagnetarWritableStorageNodesBelowWriteQuorum` is not (two nodes remain);
- `promtool check metrics` passes on the broker's /metrics with the ledger client's series.

Skipped without prometheus/promtool (or etcd, unless MAGNETAR_REQUIRE_ETCD=1), and on an
external broker or another server command. Only processes this test started are killed, by PID.
"""

import shutil
import tempfile

import pytest

from compat_util import http_request, receive_n, unique_topic
from prometheus_util import (POSITIVE, STORAGE_NODE_ALERTS, Prometheus, check_alert_rules,
                             check_template_variables, dashboard_targets, load_dashboards, one,
                             positive, promtool_check_metrics, require_prometheus,
                             run_dashboard_queries, scrape_job)
from replicated_util import CLUSTER, node_adds, replicated_cluster, skip_unless_own_magnetar

pytestmark = pytest.mark.restarts_server

UID = "magnetar-storage-nodes"
BATCH = 100  # messages per step of the load


class Stack:
    pass


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    skip_unless_own_magnetar()
    require_prometheus()
    with replicated_cluster(tmp_path_factory.mktemp("cluster")) as (etcd, nodes, start_broker):
        s = Stack()
        s.etcd, s.nodes = etcd, nodes
        s.broker = start_broker("a")
        s.tmp = tempfile.mkdtemp(prefix="magnetar-prometheus-cluster-")
        s.prom = Prometheus(s.tmp, [
            scrape_job("magnetar", ["127.0.0.1:%d" % s.broker.web_port]),
            scrape_job("magnetar-storage", [n.metrics_url.split("/")[2] for n in nodes]),
        ], [STORAGE_NODE_ALERTS])
        s.client = None
        try:
            s.prom.start()
            _load(s)
            yield s
        finally:
            if s.client is not None:
                s.client.close()
            s.prom.stop()
            shutil.rmtree(s.tmp, ignore_errors=True)


def _load(s):
    def diag():
        return s.broker.log_tail(60)

    s.prom.wait_until([('count(up{job="magnetar-storage"} == 1)', one(3)),
                       ('up{job="magnetar"}', one(1))], "every target scraped", diag)
    topic = unique_topic("prom-cluster")
    s.client = s.broker.client()
    consumer = s.client.subscribe(topic, "all", receiver_queue_size=BATCH)
    producer = s.client.create_producer(topic, batching_enabled=False,
                                        send_timeout_millis=120000)
    sent = 0

    def send(count):
        nonlocal sent
        for _ in range(count):
            producer.send(b"%08d" % sent)
            sent += 1

    # 1. a broker that dies with its ledgers open; the next one recovers them
    send(BATCH)
    s.prom.wait_until([("sum(magnetar_storage_node_adds_total)", lambda v: positive(v)
                        and v[0][1] >= 2 * BATCH)], "the first adds scraped", diag)
    s.broker.restart(graceful=False)
    adds_before = {n.id: node_adds(n) for n in s.nodes}
    send(BATCH)
    s.prom.wait_until([('sum(magnetar_ledger_client_recoveries_total{outcome="closed"})',
                        positive)], "the new broker's recoveries scraped", diag)

    # 2. a node the new broker's messages went to dies; writers replace it by the third node
    # (open ledgers in etcd would not tell: a killed broker's unused spares are open too)
    gained = {n.id: node_adds(n) - adds_before[n.id] for n in s.nodes}
    victim = max(s.nodes, key=lambda n: (gained[n.id], n.id))
    assert gained[victim.id] >= BATCH, gained
    # Scraped before it dies: else its rate over the dashboards' window can read 0
    taken = adds_before[victim.id] + gained[victim.id]
    s.prom.wait_until([('sum(magnetar_storage_node_adds_total{node="%d"})' % victim.id,
                        lambda v: positive(v) and v[0][1] >= taken)],
                      "the victim's adds scraped", diag)
    victim.kill()
    s.killed = victim
    s.live = [n for n in s.nodes if n is not victim]
    send(BATCH)
    messages = receive_n(consumer, sent)
    for m in messages:
        consumer.acknowledge(m)
    got = [m.data() for m in messages]
    assert got == [b"%08d" % i for i in range(sent)], "every message read back, in order"
    consumer.close()
    producer.close()

    s.at = s.prom.wait_until([
        ('count(up{job="magnetar-storage"} == 0)', one(1)),
        # the replacement's adds too (every node's rate over the dashboards' window > 0)
        ("count(increase(magnetar_storage_node_adds_total[2m]) > 0)", one(3)),
        ("sum(magnetar_ledger_client_ensemble_changes_total)", positive),
        ("sum(magnetar_ledger_client_recovery_seconds_count)", positive),
        ("sum(magnetar_storage_node_reads_total)", positive),
        ("sum(magnetar_ledger_client_unanswered_requests_total)", positive),
    ], "the node's death and the reads scraped", diag)


def variable_sets(s):
    node = str(s.live[0].id)
    return [("all", {"cluster": CLUSTER, "node": ".+"}),
            ("one", {"cluster": CLUSTER, "node": node})]


EXPECT = {
    (UID, "Storage nodes registered (brokers' view)", "B"): {"*": 2},
    (UID, "Storage nodes registered (brokers' view)", "C"): {"*": 0},  # no rack labels
    (UID, "Adds", "A"): {"*": POSITIVE},
    (UID, "Add bytes", "A"): {"*": POSITIVE},
    (UID, "Journal groups", "A"): {"*": POSITIVE},
    (UID, "Journal groups", "B"): {"*": lambda vs: all(v >= 1 for v in vs)},
    (UID, "Journal fsync latency p99", "A"): {"*": POSITIVE},
    (UID, "Ensemble changes", "A"): {"*": POSITIVE},
    (UID, "Ledger recoveries", "A"): {"*": lambda vs: max(vs) > 0},
    (UID, "Recovery time p99", "A"): {"*": POSITIVE},
    (UID, "Open ledgers", "A"): {"*": POSITIVE},
}


def test_storage_nodes_dashboard_queries(stack):
    targets = dashboard_targets(load_dashboards(storage_nodes=True))
    assert len(targets) >= 25, len(targets)
    run_dashboard_queries(stack.prom, stack.at, targets, variable_sets(stack), EXPECT)
    # no recovery failed or was superseded: only "closed" moved
    _, samples = stack.prom.query(
        'sum by (outcome) (magnetar_ledger_client_recoveries_total{outcome!="closed"})', stack.at)
    assert samples and all(v == 0 for _, v in samples), samples


def test_storage_nodes_template_variables(stack):
    s = stack
    want = {"cluster": {CLUSTER}, "node": {str(n.id) for n in s.live}}
    dashboards = load_dashboards(storage_nodes=True)
    seen = check_template_variables(s.prom, dashboards, want, {"cluster": CLUSTER})
    assert seen == set(want), seen


def test_storage_node_alert_rules(stack):
    rules = check_alert_rules(stack.prom, stack.at, [STORAGE_NODE_ALERTS])
    down = rules["MagnetarStorageNodeDown"]
    assert down["state"] in ("pending", "firing"), down
    instances = {a["labels"]["instance"] for a in down["alerts"]}
    assert instances == {stack.killed.metrics_url.split("/")[2]}, instances
    assert rules["MagnetarWritableStorageNodesBelowWriteQuorum"]["state"] == "inactive"
    assert rules["MagnetarLedgerRecoveryFailed"]["state"] == "inactive"


def test_broker_metrics_with_the_ledger_client_pass_promtool(stack):
    status, body = http_request("GET", stack.broker.web_url + "/metrics")
    assert status == 200 and b"magnetar_ledger_client_ensemble_changes_total" in body
    promtool_check_metrics(body)
