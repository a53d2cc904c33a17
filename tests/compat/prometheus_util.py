"""Shared by the tests that run the shipped dashboards (deploy/grafana/dashboards) and alert
rules (deploy/prometheus) against a real Prometheus: the Prometheus process of a test's own,
Grafana's variable substitution, and the checks every dashboard query and alert operand must
pass (non-empty, finite, not negative unless allowed, expected values). test_prometheus.py
runs them on a loaded standalone broker, test_prometheus_cluster.py on a replicated cluster."""

import datetime
import glob
import json
import math
import os
import re
import shutil
import subprocess
import time
import urllib.parse

import pytest

import conftest
from compat_util import free_port, http_request

DEPLOY = os.path.join(conftest.REPO_ROOT, "deploy")
DASHBOARD_DIR = os.path.join(DEPLOY, "grafana", "dashboards")
ALERTS = os.path.join(DEPLOY, "prometheus", "alerts.yml")
STORAGE_NODE_ALERTS = os.path.join(DEPLOY, "prometheus", "alerts-storage-nodes.yml")
PROMETHEUS_YML = os.path.join(DEPLOY, "prometheus", "prometheus.yml")
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
# Dashboards with this tag read a cluster's storage nodes: checked against a cluster.
STORAGE_NODES_TAG = "storage-nodes"
WAIT_S = 30        # bound of each wait for Prometheus to see something
# Grafana's built-in interval variables, as Grafana would set them for a short time range. The
# windows cover the whole load (the tests run well under a minute).
BUILTINS = {"__rate_interval": "2m", "__interval": "1s", "__interval_ms": "1000",
            "__range": "2m", "__range_s": "120", "__range_ms": "120000"}


def require_prometheus():
    missing = [name for name, path in (("prometheus", PROMETHEUS), ("promtool", PROMTOOL))
               if path is None]
    if missing:
        pytest.skip("%s not installed (Debian package `prometheus`; scripts/test.sh installs it "
                    "as root)" % " and ".join(missing))


def scrape_job(name, targets):
    """A scrape config for `targets` (host:port) as job `name`, keeping the targets' labels."""
    return {"job_name": name, "metrics_path": "/metrics", "honor_labels": True,
            "static_configs": [{"targets": list(targets)}]}


# ---------------------------------------------------------------------- dashboards
def load_dashboards(storage_nodes=False):
    """{file name: dashboard JSON} of the broker's dashboards, or (`storage_nodes`) of those
    for a cluster's storage nodes (tagged STORAGE_NODES_TAG)."""
    paths = sorted(glob.glob(os.path.join(DASHBOARD_DIR, "*.json")))
    assert paths, "no dashboards in %s" % DASHBOARD_DIR
    out = {}
    for path in paths:
        with open(path) as f:
            dashboard = json.load(f)
        if (STORAGE_NODES_TAG in dashboard.get("tags", [])) == storage_nodes:
            out[os.path.basename(path)] = dashboard
    assert out, "no dashboards (storage nodes: %s) in %s" % (storage_nodes, DASHBOARD_DIR)
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


def check_template_variables(prom, dashboards, want, values):
    """Each query variable's `label_values(selector, label)` of `dashboards`, its selector's
    variables filled from `values`, run through Prometheus: it must list at least `want[name]`.
    Returns the names of the variables checked."""
    seen = set()
    for name, d in dashboards.items():
        for v in d["templating"]["list"]:
            if v["type"] != "query":
                continue
            query = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
            assert m, (name, query)
            selector = substitute(m.group(1), values)
            got = set(prom.api("/api/v1/label/%s/values" % m.group(2), **{"match[]": selector}))
            assert want[v["name"]] <= got, (name, v["name"], query, got)
            seen.add(v["name"])
    return seen


def one(value):
    return lambda samples: len(samples) == 1 and samples[0][1] == value


def positive(samples):
    return bool(samples) and all(v > 0 for _, v in samples)


# A check of a dashboard query's values: a number (every value equal to it), POSITIVE (every
# value > 0) or a callable(values) -> bool.
POSITIVE = "positive"


def check_values(check, values):
    if check == POSITIVE:
        return all(v > 0 for v in values)
    if callable(check):
        return check(values)
    return bool(values) and all(v == float(check) for v in values)


def run_dashboard_queries(prom, at, targets, variable_sets, expect, known_empty=None,
                          may_be_negative=frozenset()):
    """Runs every (uid, title, refId, expr) of `targets` at `at` once per (name, values) of
    `variable_sets`: each must be non-empty (but for `known_empty`: {(uid, title, refId): (why,
    query that must be non-empty instead)}), finite, not negative (but for panels in
    `may_be_negative`: {(uid, title)}) and pass its `expect` check ({(uid, title, refId):
    {variable set name or "*": check}}). Asserts; returns the number of queries checked."""
    known_empty = known_empty or {}
    failures = []
    checked = 0
    for set_name, values in variable_sets:
        for uid, title, ref, expr in targets:
            q = substitute(expr, values)
            where = "%s / %s / %s [%s]: %s" % (uid, title, ref, set_name, q)
            try:
                _, samples = prom.query(q, at)
            except AssertionError as e:
                failures.append("%s\n    query failed: %s" % (where, e))
                continue
            vals = [v for _, v in samples]
            known = known_empty.get((uid, title, ref))
            if not vals and known:
                _, probe = prom.query(substitute(known[1], values), at)
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
            if (uid, title) not in may_be_negative and any(v < 0 for v in vals):
                failures.append("%s\n    negative: %r" % (where, samples))
            wanted = expect.get((uid, title, ref), {})
            check = wanted.get(set_name, wanted.get("*"))
            if check is not None and not check_values(check, vals):
                failures.append("%s\n    expected %s, got %r" % (
                    where, check if not callable(check) else check.__name__, samples))
            checked += 1
    print("%d dashboard queries run (%d targets x %d variable sets)"
          % (checked, len(targets), len(variable_sets)))
    assert not failures, "%d of the dashboard queries failed:\n%s" % (
        len(failures), "\n".join(failures))
    # every expect/known_empty key names a query that exists (a renamed panel keeps its check)
    keys = {(uid, title, ref) for uid, title, ref, _ in targets}
    assert not set(expect) - keys, set(expect) - keys
    assert not set(known_empty) - keys, set(known_empty) - keys
    return checked


# ---------------------------------------------------------------------- Prometheus process
class Prometheus:
    """A Prometheus server of the test's own on loopback; stop() kills exactly that process."""

    def __init__(self, tmp, scrape_configs, rule_files):
        """`scrape_configs`: Prometheus scrape configs (see `scrape_job`); `rule_files`: paths."""
        self.tmp = tmp
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.config = os.path.join(tmp, "prometheus.yml")
        self.log_path = os.path.join(tmp, "prometheus.log")
        # JSON is YAML: no YAML library needed
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": list(rule_files),
            "scrape_configs": list(scrape_configs),
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


def declared_alerts(rule_files):
    names = []
    for path in rule_files:
        with open(path) as f:
            names += re.findall(r"^\s*-\s*alert:\s*(\S+)", f.read(), re.M)
    assert names, "no alerts in %s" % (rule_files,)
    return names


def evaluated_at(rule):
    """A rule's last evaluation time (Unix seconds), 0 for none yet."""
    stamp = rule.get("lastEvaluation", "")
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)", stamp)
    if not m or stamp.startswith("0001-"):
        return 0.0
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    whole = datetime.datetime.fromisoformat(m.group(1) + zone).timestamp()
    return whole + float(m.group(2) or 0)


def check_alert_rules(prom, at, rule_files):
    """Every alert of `rule_files` is loaded and evaluated healthy, with a comparison, and each
    operand of its top-level comparison and set operators is non-empty and finite at `at` (a
    misspelt metric or label would make the alert silently never fire). Returns the loaded
    rules ({name: rule as /api/v1/rules has it})."""
    declared = declared_alerts(rule_files)

    def loaded():
        return [r for g in prom.api("/api/v1/rules")["groups"] for r in g["rules"]]

    # every rule evaluated, healthy, after `at` (evaluation every second): its state is the
    # state of what the checks below see
    deadline = time.monotonic() + WAIT_S
    while True:
        rules = loaded()
        if rules and all(r.get("health") == "ok" and evaluated_at(r) > at for r in rules):
            break
        assert time.monotonic() < deadline, "rules not all healthy:\n%s\n%s" % (
            json.dumps(rules, indent=1), prom.log_tail())
        time.sleep(0.25)  # polling Prometheus' rule evaluation: no event to wait on
    assert sorted(r["name"] for r in rules) == sorted(declared)
    failures = []
    for r in rules:
        assert r["type"] == "alerting" and not r.get("lastError"), r
        operands = split_top_level(r["query"])
        assert len(operands) >= 2, (r["name"], r["query"], "no comparison: always firing?")
        for operand in operands:
            kind, samples = prom.query(operand, at)
            if kind == "scalar":
                continue
            if not samples:
                failures.append("%s: %s\n    operand %s is empty" % (r["name"], r["query"], operand))
            elif not all(math.isfinite(v) for _, v in samples):
                failures.append("%s: %s\n    operand %s is not a number: %r"
                                % (r["name"], r["query"], operand, samples))
        print("%-45s %-8s %d operands checked" % (r["name"], r["state"], len(operands)))
    assert not failures, "\n".join(failures)
    return {r["name"]: r for r in rules}


def promtool_check_rules(path):
    r = subprocess.run([PROMTOOL, "check", "rules", path], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, "promtool check rules %s:\n%s%s" % (path, r.stdout, r.stderr)


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


def promtool_check_metrics(body):
    """`promtool check metrics` on an exposition: nothing but PULSAR_NAMES_LINT."""
    r = subprocess.run([PROMTOOL, "check", "metrics"], input=body, capture_output=True, timeout=60)
    out = (r.stdout + r.stderr).decode("utf-8", "replace")
    problems = [line.strip() for line in out.splitlines() if line.strip()]
    print(out)
    unexpected = [line for line in problems if line not in PULSAR_NAMES_LINT]
    assert not unexpected, "promtool check metrics, beyond Pulsar's own names:\n" + "\n".join(unexpected)
    # exit code 3: lint problems only (1 would be a parse error)
    assert r.returncode == (3 if problems else 0), (r.returncode, out)
