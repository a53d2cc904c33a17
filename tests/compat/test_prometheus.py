"""The Grafana dashboards (deploy/grafana/dashboards/*.json) and the Prometheus rules
(deploy/prometheus/alerts.yml) against a real Prometheus scraping a loaded broker (the storage
nodes' dashboard and rules: test_prometheus_cluster.py; the shared checks: prometheus_util.py).

The real Prometheus server (`prometheus`, Debian package `prometheus`; scripts/test.sh installs it
when missing) is started on a free loopback port with a config the test writes (job "magnetar",
scrape and rule evaluation every second, the shipped alerts.yml as its rule file, TSDB in a temp
dir), scraping a broker of the test's own (so totals are exactly what the test did; 5-second
stats intervals for the `pulsar_*_le_*` bucket gauges, a 64 KiB write cache so that reads miss
it). The load: two topics, each with a producer that sends known messages in two halves (a
scrape in between, so rates are non-zero); topic A has a Shared subscription whose consumer
acknowledges only some (backlog and unacknowledged messages) and a reader from the earliest
message (disk reads), topic B an Exclusive subscription that acknowledges everything. The waits
poll Prometheus' query API, bounded; nothing sleeps to synchronise. They end at one evaluation
time at which Prometheus has all of it, and every query below is evaluated at that time, so the
checks do not race the scrapes or the stats intervals.

Then:
- every `targets[].expr` of every dashboard is run through /api/v1/query with the template
  variables substituted (all values, and once each for topic A and topic B with their
  subscriptions; `$__rate_interval` and friends with a window covering the load): each must
  return a non-empty result whose values are finite and not negative (MAY_BE_NEGATIVE and
  KNOWN_EMPTY below list the exceptions, with why) and match EXPECT's exact or positive values
  (e.g. the overview's backlog is what topic A's consumer left, its topic count 2);
- every template variable's `label_values(...)` query, through /api/v1/label/.../values: it
  lists the cluster, broker, namespace, topics and subscriptions of the load;
- `sum(pulsar_in_messages_total)` is exactly the number of messages sent, `pulsar_msg_backlog`
  of topic A the number not acknowledged, the bucket gauges add up to their `_count`, and a few
  more totals;
- the alert rules: Prometheus loaded every rule of alerts.yml and evaluates each with health
  "ok" and no error. An alert's expression is legitimately empty while its condition is false
  (a healthy broker), so each expression is also split at its top-level comparison and set
  operators (`>`, `==`, `and`, ...) and every operand that is not a number is run on its own: it
  must be non-empty and finite (so a misspelt metric or label, which would make the alert
  silently never fire, fails the test);
- `promtool check rules` on alerts.yml, `promtool check config` on the shipped prometheus.yml
  and the generated one, and `promtool check metrics` on the body of GET /metrics: no problem
  but the lint of names that are Apache Pulsar's own (PULSAR_NAMES_LINT);
- the dashboards' structure (Grafana 9+ schema, data source variable, unique panel ids, only
  known variables), without Prometheus.

Skipped (with the reason) when prometheus or promtool are not installed, and on an external
broker or another server command (it needs a broker of its own with Magnetar's metrics).
"""

import os
import re
import shutil
import subprocess
import tempfile

import pulsar
import pytest

import conftest
from compat_util import http_request, read_n, receive_n, unique_topic
from prometheus_util import (ALERTS, POSITIVE, PROMETHEUS_YML, PROMTOOL, STORAGE_NODE_ALERTS,
                             Prometheus, check_alert_rules, check_template_variables,
                             dashboard_targets, iter_panels, load_dashboards, one, positive,
                             promtool_check_metrics, promtool_check_rules, require_prometheus,
                             run_dashboard_queries, scrape_job,
                             split_top_level, substitute)

CLUSTER = "standalone"
NAMESPACE = "public/default"
N_A = 200          # messages sent to topic A (Shared subscription, acknowledges ACKED_A)
ACKED_A = 30
N_B = 100          # messages sent to topic B (Exclusive subscription, acknowledges all)
PAYLOAD = 1000     # bytes per message
SUB_A = "backlog-sub"
SUB_B = "acked-sub"

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("MAGNETAR_TEST_SERVICE_URL") or os.environ.get("MAGNETAR_TEST_SERVER_CMD")),
    reason="needs a broker of its own with Magnetar's metrics")


# ---------------------------------------------------------------------- dashboards and rules
def test_dashboards_are_well_formed():
    """Structure Grafana 9+ needs to import or provision the dashboards (no Prometheus needed),
    the storage nodes' too."""
    dashboards = {**load_dashboards(), **load_dashboards(storage_nodes=True)}
    uids = [d.get("uid") for d in dashboards.values()]
    assert len(set(uids)) == len(uids) and all(uids), uids
    for name, d in dashboards.items():
        assert d.get("schemaVersion", 0) >= 36, (name, d.get("schemaVersion"))
        assert d.get("title") and d.get("id") is None, name
        variables = {v["name"]: v for v in d["templating"]["list"]}
        ds = variables.get("DS_PROMETHEUS")
        assert ds and ds["type"] == "datasource" and ds["query"] == "prometheus", name
        for v in variables.values():
            if v["type"] == "query":
                assert v["datasource"]["uid"] == "${DS_PROMETHEUS}", (name, v["name"])
                query = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
                assert re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query), (name, query)
                substitute(query, {k: ".+" for k in variables})  # only known variables
        ids = [p["id"] for p in iter_panels(d["panels"])]
        assert len(set(ids)) == len(ids), (name, "panel ids not unique")
        for p in iter_panels(d["panels"]):
            g = p["gridPos"]
            assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, (name, p["title"])
            if p["type"] == "row":
                continue
            assert p["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, (name, p["title"])
            targets = p.get("targets", [])
            assert targets, (name, p["title"], "no queries")
            refs = [t["refId"] for t in targets]
            assert len(set(refs)) == len(refs), (name, p["title"], refs)
            for t in targets:
                assert t.get("expr"), (name, p["title"], t)
                substitute(t["expr"], {k: ".+" for k in variables})
    # the five dashboards deploy/README.md describes
    assert {"magnetar-overview", "magnetar-topic", "magnetar-subscription",
            "magnetar-storage", "magnetar-storage-nodes"} <= set(uids), uids


def test_promtool_check_rules_and_shipped_config():
    require_prometheus()
    for path in (ALERTS, STORAGE_NODE_ALERTS):
        promtool_check_rules(path)
    r = subprocess.run([PROMTOOL, "check", "config", PROMETHEUS_YML], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, "promtool check config:\n%s%s" % (r.stdout, r.stderr)


# ---------------------------------------------------------------------- the loaded stack
class Stack:
    pass


# The test's broker: the `pulsar_*_le_*` bucket gauges count over 5-second stats intervals (so one
# that holds the load completes within the test), and a 64 KiB write cache (so the reader from
# the earliest message reads from disk: cache misses and read latencies).
BROKER_TOML = """
[broker]
stats_update_frequency_seconds = 5
[storage]
write_cache_bytes = 65536
"""


@pytest.fixture(scope="module")
def stack():
    require_prometheus()
    with conftest.private_server(BROKER_TOML) as server:
        s = Stack()
        s.server = server
        s.tmp = tempfile.mkdtemp(prefix="magnetar-prometheus-")
        s.prom = None
        s.clients = []
        try:
            s.prom = Prometheus(s.tmp, [scrape_job("magnetar", ["127.0.0.1:%d" % server.web_port])],
                                [ALERTS])
            s.prom.start()
            _load(s)
            yield s
        finally:
            for client in s.clients:
                client.close()
            if s.prom is not None:
                s.prom.stop()
            shutil.rmtree(s.tmp, ignore_errors=True)


def _load(s):
    """Puts the known load on the broker and waits until Prometheus has scraped all of it;
    sets s.at, the evaluation time every later query uses (so they all see the same state)."""
    s.topic_a = unique_topic("prom-backlog")
    s.topic_b = unique_topic("prom-acked")
    s.instance = "127.0.0.1:%d" % s.server.web_port

    def diag():
        return s.server.log_tail(60)

    # 0. Prometheus has scraped the idle broker once, so the client's connection is an increase
    # of the connection counters (rates > 0)
    s.prom.wait_until([('up{job="magnetar"}', one(1))], "first scrape", diag)
    client = s.server.client()
    s.clients.append(client)
    prod_a = client.create_producer(s.topic_a, batching_enabled=False)
    prod_b = client.create_producer(s.topic_b, batching_enabled=False)
    cons_a = client.subscribe(s.topic_a, SUB_A, consumer_type=pulsar.ConsumerType.Shared,
                              receiver_queue_size=50)
    cons_b = client.subscribe(s.topic_b, SUB_B, consumer_type=pulsar.ConsumerType.Exclusive)
    s.keep = [prod_a, prod_b, cons_a, cons_b]  # open until the end: producer/consumer counts

    # 1. Prometheus has scraped both topics before any message: their counters start at 0.
    topics = 'topic=~"%s|%s"' % (s.topic_a, s.topic_b)
    s.prom.wait_until([("sum(pulsar_producers_count{%s})" % topics, one(2))],
                      "both topics' producers scraped", diag)

    def send(producer, first, count):
        errors = []
        for i in range(first, first + count):
            body = b"%08d" % i + bytes(PAYLOAD - 8)
            producer.send_async(body, lambda res, _id: res == pulsar.Result.Ok or errors.append(res))
        producer.flush()
        assert not errors, errors[:5]

    # 2. the first half, seen by a scrape, then the second half: rates over the window > 0
    send(prod_a, 0, N_A // 2)
    send(prod_b, 0, N_B // 2)
    s.prom.wait_until([("sum(pulsar_in_messages_total{%s})" % topics, one(N_A // 2 + N_B // 2))],
                      "first half of the messages scraped", diag)
    send(prod_a, N_A // 2, N_A - N_A // 2)
    send(prod_b, N_B // 2, N_B - N_B // 2)

    # 3. consume: B all, acknowledged; A only ACKED_A acknowledged, the rest is backlog (and
    # what its consumer holds in its receiver queue is unacknowledged)
    for m in receive_n(cons_b, N_B):
        cons_b.acknowledge(m)
    for m in receive_n(cons_a, ACKED_A):
        cons_a.acknowledge(m)
    # a reader from the earliest message: older entries are out of the write cache (disk reads)
    reader = client.create_reader(s.topic_a, pulsar.MessageId.earliest)
    read_n(reader, N_A)
    reader.close()

    # 4. one evaluation time at which Prometheus has all of it, and a completed stats interval
    # with writes (the bucket gauges) for both topics
    a, b = 'topic="%s"' % s.topic_a, 'topic="%s"' % s.topic_b
    s.at = s.prom.wait_until([
        ("sum(pulsar_in_messages_total{%s})" % topics, one(N_A + N_B)),
        ('sum(pulsar_out_messages_total{%s, subscription="%s"})' % (b, SUB_B), one(N_B)),
        ("sum(pulsar_msg_backlog{%s})" % a, one(N_A - ACKED_A)),
        ("sum(pulsar_msg_backlog{%s})" % b, one(0)),
        ("sum(pulsar_subscriptions_count{%s})" % topics, one(2)),  # the reader's is gone
        ("sum(pulsar_subscription_unacked_messages{%s})" % a, positive),
        ("pulsar_storage_write_latency_count{%s}" % a, positive),
        ("pulsar_storage_write_latency_count{%s}" % b, positive),
        ("pulsar_entry_size_count{%s}" % a, positive),
        ("pulsar_entry_size_count{%s}" % b, positive),
        ("sum(magnetar_ledger_read_cache_misses_total)", positive),
        ("sum(magnetar_ledger_read_cache_hits_total)", positive),
    ], "the load scraped", diag)


def variable_sets(s):
    """Template variable values to run the dashboards with: all, topic A, topic B."""
    everything = {"cluster": CLUSTER, "instance": ".+", "namespace": ".+", "topic": ".+",
                  "subscription": ".+"}
    for t in (s.topic_a, s.topic_b):
        assert re.fullmatch(r"[\w:/-]+", t), t  # no regex metacharacters to escape
    return [
        ("all", everything),
        ("A", {"cluster": CLUSTER, "instance": s.instance, "namespace": NAMESPACE,
               "topic": s.topic_a, "subscription": SUB_A}),
        ("B", {"cluster": CLUSTER, "instance": s.instance, "namespace": NAMESPACE,
               "topic": s.topic_b, "subscription": SUB_B}),
    ]


# What specific dashboard queries must return after the load, per variable set.
# Key: (dashboard uid, panel title, refId) -> {variable set name or "*": check}.
EXPECT = {
    ("magnetar-overview", "Topics", "A"): {"*": 2},
    ("magnetar-overview", "Subscriptions", "A"): {"*": 2},
    ("magnetar-overview", "Producers", "A"): {"*": 2},
    ("magnetar-overview", "Consumers", "A"): {"*": 2},
    ("magnetar-overview", "Backlog (messages)", "A"): {"*": N_A - ACKED_A},
    ("magnetar-overview", "Storage size", "A"): {"*": POSITIVE},
    ("magnetar-overview", "Messages in / out", "A"): {"*": POSITIVE},
    ("magnetar-overview", "Messages in / out", "B"): {"*": POSITIVE},
    ("magnetar-overview", "Throughput in / out", "A"): {"*": POSITIVE},
    ("magnetar-overview", "Throughput in / out", "B"): {"*": POSITIVE},
    ("magnetar-overview", "Messages in by namespace", "A"): {"*": POSITIVE},
    ("magnetar-overview", "Top 10 topics by messages in", "A"): {"*": POSITIVE},
    ("magnetar-overview", "Active connections", "A"): {"*": POSITIVE},
    ("magnetar-overview", "Connections opened / closed / failed", "A"): {"*": POSITIVE},
    ("magnetar-overview", "Memory", "A"): {"*": POSITIVE},
    ("magnetar-overview", "Open file descriptors", "A"): {"*": POSITIVE},
    ("magnetar-overview", "Open file descriptors", "B"): {"*": POSITIVE},
    ("magnetar-overview", "Uptime", "A"): {"*": POSITIVE},
    ("magnetar-topic", "Messages in", "A"): {"*": POSITIVE},
    ("magnetar-topic", "Messages out (all subscriptions)", "A"): {"*": POSITIVE},
    ("magnetar-topic", "Throughput in", "A"): {"*": POSITIVE},
    ("magnetar-topic", "Producers, consumers, subscriptions", "A"): {"*": 1},
    ("magnetar-topic", "Producers, consumers, subscriptions", "B"): {"*": 1},
    ("magnetar-topic", "Producers, consumers, subscriptions", "C"): {"*": 1},
    ("magnetar-topic", "Backlog (messages)", "A"): {"A": N_A - ACKED_A, "B": 0},
    ("magnetar-topic", "Backlog size", "A"): {"A": POSITIVE, "B": 0},
    ("magnetar-topic", "Storage size", "A"): {"*": POSITIVE},
    ("magnetar-subscription", "Backlog (messages)", "A"): {"A": N_A - ACKED_A, "B": 0},
    ("magnetar-subscription", "Unacknowledged messages", "A"): {"A": POSITIVE, "B": 0},
    ("magnetar-subscription", "Blocked on unacked messages", "A"): {"*": 0},
    ("magnetar-subscription", "Dispatch rate", "B"): {"*": POSITIVE},
    ("magnetar-storage", "Group commits", "A"): {"*": POSITIVE},
    ("magnetar-storage", "Records per group", "A"): {"*": lambda vs: all(v >= 1 for v in vs)},
    ("magnetar-storage", "Journal bytes written", "A"): {"*": POSITIVE},
    ("magnetar-storage", "fsync latency", "A"): {"*": POSITIVE},
    ("magnetar-storage", "fsync latency", "B"): {"*": POSITIVE},
    ("magnetar-storage", "fsyncs per second", "A"): {"*": POSITIVE},
    ("magnetar-storage", "Disk used / free", "A"): {"*": POSITIVE},
    ("magnetar-storage", "Disk used / free", "B"): {"*": POSITIVE},
    ("magnetar-storage", "Read cache hit ratio", "A"): {"*": lambda vs: all(0 <= v <= 1 for v in vs)},
    ("magnetar-storage", "Metadata operations", "A"): {"*": lambda vs: any(v > 0 for v in vs)},
    ("magnetar-storage", "Metadata operations", "B"): {"*": POSITIVE},
    ("magnetar-storage", "Ledger read latency", "A"): {"*": POSITIVE},
    ("magnetar-storage", "Ledger read latency", "C"): {"*": POSITIVE},
    ("magnetar-storage", "Ledger reads", "A"): {"*": POSITIVE},
    ("magnetar-storage", "Ledger reads", "B"): {"*": POSITIVE},
    ("magnetar-storage", "Ledger reads", "C"): {"*": POSITIVE},
    ("magnetar-storage", "Metadata operation latency p99", "A"): {"*": POSITIVE},
    ("magnetar-topic", "Storage write latency: mean and share above 50 ms", "A"): {"*": POSITIVE},
    ("magnetar-topic", "Entries written and mean entry size", "A"): {"*": POSITIVE},
    ("magnetar-topic", "Entries written and mean entry size", "B"): {
        "*": lambda vs: all(PAYLOAD <= v <= PAYLOAD + 200 for v in vs)},
}
# Panels whose values may be negative: the backlog quota limits are -1 when there is none.
MAY_BE_NEGATIVE = {("magnetar-topic", "Backlog quota and publish throttling")}
# Queries allowed to be empty, with why, and a query (template variables allowed) that must be
# non-empty all the same, so that the metric's name and labels are still checked.
KNOWN_EMPTY = {}


def test_dashboard_queries(stack):
    targets = dashboard_targets(load_dashboards())
    assert len(targets) >= 40, len(targets)
    run_dashboard_queries(stack.prom, stack.at, targets, variable_sets(stack), EXPECT,
                          KNOWN_EMPTY, MAY_BE_NEGATIVE)


def test_template_variables(stack):
    """Each dashboard variable's label_values(selector, label) lists the load's values."""
    s = stack
    want = {"cluster": {CLUSTER}, "instance": {s.instance}, "namespace": {NAMESPACE},
            "topic": {s.topic_a, s.topic_b}, "subscription": {SUB_A, SUB_B}}
    values = {"cluster": CLUSTER, "instance": ".+", "namespace": ".+", "topic": ".+",
              "subscription": ".+"}
    seen = check_template_variables(s.prom, load_dashboards(), want, values)
    assert seen == set(want), seen


def test_exact_totals(stack):
    s, p = stack, stack.prom
    assert p.value("sum(pulsar_in_messages_total)", s.at) == N_A + N_B
    assert p.value('sum(pulsar_in_messages_total{topic="%s"})' % s.topic_a, s.at) == N_A
    assert p.value('sum(pulsar_in_bytes_total{topic="%s"})' % s.topic_b, s.at) >= N_B * PAYLOAD
    assert p.value('pulsar_msg_backlog{topic="%s"}' % s.topic_a, s.at) == N_A - ACKED_A
    assert p.value('pulsar_subscription_back_log{topic="%s", subscription="%s"}'
                   % (s.topic_a, SUB_A), s.at) == N_A - ACKED_A
    assert p.value('pulsar_msg_backlog{topic="%s"}' % s.topic_b, s.at) == 0
    assert p.value('sum(pulsar_out_messages_total{topic="%s"})' % s.topic_b, s.at) == N_B
    assert p.value('sum(pulsar_out_messages_total{topic="%s"})' % s.topic_a, s.at) >= ACKED_A
    assert p.value('pulsar_topics_count{namespace="%s"}' % NAMESPACE, s.at) == 2
    assert p.value('sum(pulsar_subscription_unacked_messages{topic="%s"})' % s.topic_a, s.at) > 0
    assert p.value('up{job="magnetar"}', s.at) == 1
    assert p.value("sum(pulsar_producers_count)", s.at) == 2
    assert p.value("sum(pulsar_consumers_count)", s.at) == 2
    # the bucket gauges of a completed stats interval add up to its _count; every entry is one
    # message of PAYLOAD bytes plus its metadata
    for t in (s.topic_a, s.topic_b):
        sel = '{topic="%s"}' % t
        count = p.value("pulsar_storage_write_latency_count" + sel, s.at)
        buckets = p.value('sum({__name__=~"pulsar_storage_write_latency_(le_.*|overflow)", topic="%s"})'
                          % t, s.at)
        assert count > 0 and buckets == count, (t, count, buckets)
        count = p.value("pulsar_entry_size_count" + sel, s.at)
        buckets = p.value('sum({__name__=~"pulsar_entry_size_le_.*", topic="%s"})' % t, s.at)
        assert count > 0 and buckets == count, (t, count, buckets)
        mean = p.value("pulsar_entry_size_sum%s / pulsar_entry_size_count%s" % (sel, sel), s.at)
        assert PAYLOAD <= mean <= PAYLOAD + 200, (t, mean)


# ---------------------------------------------------------------------- alert rules
def test_split_top_level():
    assert split_top_level('up{job="magnetar"} == 0') == ['up{job="magnetar"}', "0"]
    assert split_top_level('a{x=~"y|z",w!="1"} > bool 0.1 * sum by (t) (b) and on (t) c') == [
        'a{x=~"y|z",w!="1"}', "0.1 * sum by (t) (b)", "c"]
    assert split_top_level("rate(x[5m]) / (y >= 2)") == ["rate(x[5m]) / (y >= 2)"]
    assert split_top_level("sum(android) < 3") == ["sum(android)", "3"]


def test_alert_rules(stack):
    check_alert_rules(stack.prom, stack.at, [ALERTS])


# ---------------------------------------------------------------------- promtool
def test_promtool_check_generated_config(stack):
    r = stack.prom.check_config()
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_check_metrics(stack):
    status, body = http_request("GET", stack.server.web_url + "/metrics")
    assert status == 200 and body, (status, body[:200])
    promtool_check_metrics(body)
