"""The Grafana dashboards (deploy/grafana/dashboards/*.json) and the Prometheus rules
(deploy/prometheus/alerts.yml) against a real Prometheus scraping a loaded broker.

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

import glob
import json
import math
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse

import pulsar
import pytest

import conftest
from compat_util import free_port as _free_port, http_request, read_n, receive_n, unique_topic

DEPLOY = os.path.join(conftest.REPO_ROOT, "deploy")
DASHBOARD_DIR = os.path.join(DEPLOY, "grafana", "dashboards")
ALERTS = os.path.join(DEPLOY, "prometheus", "alerts.yml")
PROMETHEUS_YML = os.path.join(DEPLOY, "prometheus", "prometheus.yml")
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")

CLUSTER = "standalone"
NAMESPACE = "public/default"
N_A = 200          # messages sent to topic A (Shared subscription, acknowledges ACKED_A)
ACKED_A = 30
N_B = 100          # messages sent to topic B (Exclusive subscription, acknowledges all)
PAYLOAD = 1000     # bytes per message
SUB_A = "backlog-sub"
SUB_B = "acked-sub"
WAIT_S = 30        # bound of each wait for Prometheus to see something
# Grafana's built-in interval variables, as Grafana would set them for a short time range. The
# windows cover the whole load (the test runs well under a minute).
BUILTINS = {"__rate_interval": "2m", "__interval": "1s", "__interval_ms": "1000",
            "__range": "2m", "__range_s": "120", "__range_ms": "120000"}

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("MAGNETAR_TEST_SERVICE_URL") or os.environ.get("MAGNETAR_TEST_SERVER_CMD")),
    reason="needs a broker of its own with Magnetar's metrics")


def _require_prometheus():
    missing = [name for name, path in (("prometheus", PROMETHEUS), ("promtool", PROMTOOL))
               if path is None]
    if missing:
        pytest.skip("%s not installed (Debian package `prometheus`; scripts/test.sh installs it "
                    "as root)" % " and ".join(missing))


# ---------------------------------------------------------------------- dashboards and rules
def load_dashboards():
    """{file name: dashboard JSON}"""
    paths = sorted(glob.glob(os.path.join(DASHBOARD_DIR, "*.json")))
    assert paths, "no dashboards in %s" % DASHBOARD_DIR
    out = {}
    for path in paths:
        with open(path) as f:
            out[os.path.basename(path)] = json.load(f)
    return out


def iter_panels(panels):
    for p in panels:
        yield p
        yield from iter_panels(p.get("panels", []))  # rows (collapsed or not) hold panels too


def dashboard_targets(dashboards):
    """[(dashboard uid, panel title, refId, expr)] of every query of every panel."""
    out = []
    for d in dashboards.values():
        for p in iter_panels(d.get("panels", [])):
            for t in p.get("targets", []):
                if t.get("expr"):
                    out.append((d["uid"], p.get("title", ""), t.get("refId", ""), t["expr"]))
    return out


VAR_RE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")


def substitute(expr, values):
    """Grafana's variable syntaxes ($x, ${x}, ${x:fmt}, [[x]]) replaced by `values`; an unknown
    variable is an error (a typo in a dashboard)."""
    def repl(m):
        name = m.group(1) or m.group(2) or m.group(3)
        if name in values:
            return values[name]
        if name in BUILTINS:
            return BUILTINS[name]
        raise AssertionError("unknown template variable $%s in %r" % (name, expr))
    return VAR_RE.sub(repl, expr)


def test_dashboards_are_well_formed():
    """Structure Grafana 9+ needs to import or provision the dashboards (no Prometheus needed)."""
    dashboards = load_dashboards()
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
    # the four dashboards the README describes
    assert {"magnetar-overview", "magnetar-topic", "magnetar-subscription",
            "magnetar-storage"} <= set(uids), uids


def test_promtool_check_rules_and_shipped_config():
    _require_prometheus()
    for args in (["check", "rules", ALERTS], ["check", "config", PROMETHEUS_YML]):
        r = subprocess.run([PROMTOOL] + args, capture_output=True, text=True, timeout=60)
        print(r.stdout + r.stderr)
        assert r.returncode == 0, "promtool %s:\n%s%s" % (" ".join(args), r.stdout, r.stderr)


# ---------------------------------------------------------------------- Prometheus process
class Prometheus:
    """A Prometheus server of the test's own on loopback; stop() kills exactly that process."""

    def __init__(self, tmp, scrape_target):
        self.tmp = tmp
        self.port = _free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.config = os.path.join(tmp, "prometheus.yml")
        self.log_path = os.path.join(tmp, "prometheus.log")
        # JSON is YAML: no YAML library needed
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [ALERTS],
            "scrape_configs": [{"job_name": "magnetar", "metrics_path": "/metrics",
                                "honor_labels": True,
                                "static_configs": [{"targets": [scrape_target]}]}],
        }
        with open(self.config, "w") as f:
            json.dump(config, f, indent=2)
        self.proc = None
        self._log = None

    def check_config(self):
        return subprocess.run([PROMTOOL, "check", "config", self.config], capture_output=True,
                              text=True, timeout=60)

    def start(self):
        cmd = [PROMETHEUS, "--config.file=" + self.config,
               "--storage.tsdb.path=" + os.path.join(self.tmp, "tsdb"),
               "--web.listen-address=127.0.0.1:%d" % self.port,
               "--storage.tsdb.retention.time=1h"]
        if shutil.which("setpriv"):  # dies with this pytest process even if pytest is killed
            cmd = ["setpriv", "--pdeathsig", "KILL", "--"] + cmd
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, cwd=self.tmp)
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("prometheus exited with %s\n%s" % (self.proc.returncode, self.log_tail()))
            try:
                status, _ = http_request("GET", self.url + "/-/ready", timeout=2)
                if status == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("prometheus not ready after 30 s\n" + self.log_tail())
            time.sleep(0.1)  # polling process start-up: there is no event to wait on

    def stop(self):
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()  # only the process this test started, by its pid
            self.proc.wait(timeout=30)
            self.proc = None
        if self._log:
            self._log.close()
            self._log = None

    def log_tail(self, lines=40):
        try:
            with open(self.log_path, "rb") as f:
                data = f.read().decode("utf-8", "replace").splitlines()
        except OSError:
            return "(no prometheus log)"
        return "----- prometheus log (last %d lines) -----\n%s" % (
            min(lines, len(data)), "\n".join(data[-lines:]))

    # ------------------------------------------------------------------ HTTP API
    def api(self, path, **params):
        url = self.url + path + "?" + urllib.parse.urlencode(params, doseq=True)
        status, body = http_request("GET", url, timeout=10)
        doc = json.loads(body)
        if status != 200 or doc.get("status") != "success":
            raise AssertionError("GET %s: %s %s" % (url, status, body[:500]))
        return doc["data"]

    def query(self, expr, at=None):
        """(resultType, [(labels, float value)]) of an instant query at `at` (Unix seconds;
        default now)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = "%.3f" % at
        data = self.api("/api/v1/query", **params)
        kind = data["resultType"]
        if kind == "scalar":
            return kind, [({}, float(data["result"][1]))]
        if kind == "vector":
            return kind, [(r["metric"], float(r["value"][1])) for r in data["result"]]
        raise AssertionError("%r: unexpected result type %s" % (expr, kind))

    def value(self, expr, at=None):
        """The single value of a query returning one sample, else None."""
        _, samples = self.query(expr, at)
        return samples[0][1] if len(samples) == 1 else None

    def wait_until(self, conditions, what, diag=lambda: ""):
        """Polls until every (expr, predicate(samples)) of `conditions` holds at one evaluation
        time, at most WAIT_S seconds; returns that time (Unix seconds)."""
        deadline = time.monotonic() + WAIT_S
        while True:
            at = time.time()
            failing = []
            for expr, predicate in conditions:
                _, samples = self.query(expr, at)
                if not predicate(samples):
                    failing.append("%s = %r" % (expr, samples))
            if not failing:
                return at
            if time.monotonic() > deadline:
                raise AssertionError("%s: after %d s, still\n  %s\n%s\n%s" % (
                    what, WAIT_S, "\n  ".join(failing), self.log_tail(), diag()))
            time.sleep(0.25)  # polling Prometheus: scrapes have no event to wait on


def _one(value):
    return lambda samples: len(samples) == 1 and samples[0][1] == value


def _positive(samples):
    return bool(samples) and all(v > 0 for _, v in samples)


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
    _require_prometheus()
    with conftest.private_server(BROKER_TOML) as server:
        s = Stack()
        s.server = server
        s.tmp = tempfile.mkdtemp(prefix="magnetar-prometheus-")
        s.prom = None
        s.clients = []
        try:
            s.prom = Prometheus(s.tmp, "127.0.0.1:%d" % server.web_port)
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
    s.prom.wait_until([('up{job="magnetar"}', _one(1))], "first scrape", diag)
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
    s.prom.wait_until([("sum(pulsar_producers_count{%s})" % topics, _one(2))],
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
    s.prom.wait_until([("sum(pulsar_in_messages_total{%s})" % topics, _one(N_A // 2 + N_B // 2))],
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
        ("sum(pulsar_in_messages_total{%s})" % topics, _one(N_A + N_B)),
        ('sum(pulsar_out_messages_total{%s, subscription="%s"})' % (b, SUB_B), _one(N_B)),
        ("sum(pulsar_msg_backlog{%s})" % a, _one(N_A - ACKED_A)),
        ("sum(pulsar_msg_backlog{%s})" % b, _one(0)),
        ("sum(pulsar_subscriptions_count{%s})" % topics, _one(2)),  # the reader's is gone
        ("sum(pulsar_subscription_unacked_messages{%s})" % a, _positive),
        ("pulsar_storage_write_latency_count{%s}" % a, _positive),
        ("pulsar_storage_write_latency_count{%s}" % b, _positive),
        ("pulsar_entry_size_count{%s}" % a, _positive),
        ("pulsar_entry_size_count{%s}" % b, _positive),
        ("sum(magnetar_ledger_read_cache_misses_total)", _positive),
        ("sum(magnetar_ledger_read_cache_hits_total)", _positive),
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
# Key: (dashboard uid, panel title, refId) -> {variable set name or "*": check}; a check is
# a number (every value equal to it), POSITIVE (every value > 0) or a callable(values) -> bool.
POSITIVE = "positive"
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


def _check(check, values):
    if check == POSITIVE:
        return all(v > 0 for v in values)
    if callable(check):
        return check(values)
    return bool(values) and all(v == float(check) for v in values)


def test_dashboard_queries(stack):
    targets = dashboard_targets(load_dashboards())
    assert len(targets) >= 40, len(targets)
    failures = []
    checked = 0
    for set_name, values in variable_sets(stack):
        for uid, title, ref, expr in targets:
            q = substitute(expr, values)
            where = "%s / %s / %s [%s]: %s" % (uid, title, ref, set_name, q)
            try:
                _, samples = stack.prom.query(q, stack.at)
            except AssertionError as e:
                failures.append("%s\n    query failed: %s" % (where, e))
                continue
            vals = [v for _, v in samples]
            known = KNOWN_EMPTY.get((uid, title, ref))
            if not vals and known:
                _, probe = stack.prom.query(substitute(known[1], values), stack.at)
                if not probe:
                    failures.append("%s\n    empty, and so is %s" % (where, known[1]))
                else:
                    print("allowed empty (%s): %s" % (known[0], where))
                continue
            if not vals:
                failures.append("%s\n    empty result" % where)
                continue
            if not all(math.isfinite(v) for v in vals):
                failures.append("%s\n    NaN or infinite: %r" % (where, samples))
                continue
            if (uid, title) not in MAY_BE_NEGATIVE and any(v < 0 for v in vals):
                failures.append("%s\n    negative: %r" % (where, samples))
            expect = EXPECT.get((uid, title, ref), {})
            check = expect.get(set_name, expect.get("*"))
            if check is not None and not _check(check, vals):
                failures.append("%s\n    expected %s, got %r" % (
                    where, check if not callable(check) else check.__name__, samples))
            checked += 1
    print("%d dashboard queries run (%d targets x %d variable sets)"
          % (checked, len(targets), len(variable_sets(stack))))
    assert not failures, "%d of the dashboard queries failed:\n%s" % (
        len(failures), "\n".join(failures))
    # every EXPECT key names a query that exists (a renamed panel must not drop its check)
    keys = {(uid, title, ref) for uid, title, ref, _ in targets}
    assert not set(EXPECT) - keys, set(EXPECT) - keys
    assert not set(KNOWN_EMPTY) - keys, set(KNOWN_EMPTY) - keys


def test_template_variables(stack):
    """Each dashboard variable's label_values(selector, label) lists the load's values."""
    s = stack
    want = {"cluster": {CLUSTER}, "instance": {s.instance}, "namespace": {NAMESPACE},
            "topic": {s.topic_a, s.topic_b}, "subscription": {SUB_A, SUB_B}}
    seen = set()
    for name, d in load_dashboards().items():
        for v in d["templating"]["list"]:
            if v["type"] != "query":
                continue
            query = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
            selector = substitute(m.group(1), {"cluster": CLUSTER, "instance": ".+",
                                               "namespace": ".+", "topic": ".+",
                                               "subscription": ".+"})
            got = set(s.prom.api("/api/v1/label/%s/values" % m.group(2), **{"match[]": selector}))
            assert want[v["name"]] <= got, (name, v["name"], query, got)
            seen.add(v["name"])
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
_OPERATORS = re.compile(r"==|!=|>=|<=|>|<|\b(?:and|or|unless)\b")
_MODIFIER = re.compile(r"^\s*(?:bool\b|(?:on|ignoring|group_left|group_right)\s*\([^)]*\)\s*)*", re.S)


def split_top_level(expr):
    """The operands of `expr`'s top-level comparison and set operators (outside any brackets,
    braces or strings), without the operators' modifiers (bool, on(...), group_left(...))."""
    parts, depth, quote, start, i = [], 0, None, 0, 0
    while i < len(expr):
        c = expr[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote = None
        elif c in "\"'`":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0:
            m = _OPERATORS.match(expr, i)
            if m and not (m.group(0)[0].isalpha() and i > 0 and (expr[i - 1].isalnum() or expr[i - 1] == "_")):
                parts.append(expr[start:i])
                i = m.end()
                start = i
                continue
        i += 1
    parts.append(expr[start:])
    out = []
    for part in parts:
        part = _MODIFIER.sub("", part, count=1).strip()
        if part:
            out.append(part)
    return out


def test_split_top_level():
    assert split_top_level('up{job="magnetar"} == 0') == ['up{job="magnetar"}', "0"]
    assert split_top_level('a{x=~"y|z",w!="1"} > bool 0.1 * sum by (t) (b) and on (t) c') == [
        'a{x=~"y|z",w!="1"}', "0.1 * sum by (t) (b)", "c"]
    assert split_top_level("rate(x[5m]) / (y >= 2)") == ["rate(x[5m]) / (y >= 2)"]
    assert split_top_level("sum(android) < 3") == ["sum(android)", "3"]


def test_alert_rules(stack):
    p = stack.prom
    with open(ALERTS) as f:
        declared = re.findall(r"^\s*-\s*alert:\s*(\S+)", f.read(), re.M)
    assert declared, "no alerts in %s" % ALERTS

    def loaded():
        return [r for g in p.api("/api/v1/rules")["groups"] for r in g["rules"]]

    # every rule evaluated at least once since the load (evaluation every second)
    deadline = time.monotonic() + WAIT_S
    while True:
        rules = loaded()
        if rules and all(r.get("health") == "ok" for r in rules):
            break
        assert time.monotonic() < deadline, "rules not all healthy:\n%s\n%s" % (
            json.dumps(rules, indent=1), p.log_tail())
        time.sleep(0.25)  # polling Prometheus' rule evaluation: no event to wait on
    assert sorted(r["name"] for r in rules) == sorted(declared)
    failures = []
    for r in rules:
        assert r["type"] == "alerting" and not r.get("lastError"), r
        operands = split_top_level(r["query"])
        assert len(operands) >= 2, (r["name"], r["query"], "no comparison: always firing?")
        for operand in operands:
            kind, samples = p.query(operand, stack.at)
            if kind == "scalar":
                continue
            if not samples:
                failures.append("%s: %s\n    operand %s is empty" % (r["name"], r["query"], operand))
            elif not all(math.isfinite(v) for _, v in samples):
                failures.append("%s: %s\n    operand %s is not a number: %r"
                                % (r["name"], r["query"], operand, samples))
        print("%-45s %-8s %d operands checked" % (r["name"], r["state"], len(operands)))
    assert not failures, "\n".join(failures)


# ---------------------------------------------------------------------- promtool
def test_promtool_check_generated_config(stack):
    r = stack.prom.check_config()
    assert r.returncode == 0, r.stdout + r.stderr


# What `promtool check metrics` (2.42) says about names that are Apache Pulsar's own, kept so
# that Pulsar's dashboards and alerts work. Any other line fails the test. (Pulsar's gauges
# named `..._count` are served untyped, which the lint accepts; the entry-size bucket names it
# cannot: they contain "kb" and "mb".)
PULSAR_NAMES_LINT = {
    "pulsar_entry_size_le_1_kb metric names should not contain abbreviated units",
    "pulsar_entry_size_le_2_kb metric names should not contain abbreviated units",
    "pulsar_entry_size_le_4_kb metric names should not contain abbreviated units",
    "pulsar_entry_size_le_16_kb metric names should not contain abbreviated units",
    "pulsar_entry_size_le_100_kb metric names should not contain abbreviated units",
    "pulsar_entry_size_le_1_mb metric names should not contain abbreviated units",
}


def test_promtool_check_metrics(stack):
    status, body = http_request("GET", stack.server.web_url + "/metrics")
    assert status == 200 and body, (status, body[:200])
    r = subprocess.run([PROMTOOL, "check", "metrics"], input=body, capture_output=True, timeout=60)
    out = (r.stdout + r.stderr).decode("utf-8", "replace")
    problems = [line.strip() for line in out.splitlines() if line.strip()]
    print(out)
    unexpected = [line for line in problems if line not in PULSAR_NAMES_LINT]
    assert not unexpected, "promtool check metrics, beyond Pulsar's own names:\n" + "\n".join(unexpected)
    # exit code 3: lint problems only (1 would be a parse error)
    assert r.returncode == (3 if problems else 0), (r.returncode, out)
