"""What the cluster benchmarks (failover.py, many_topics_failover.py, brokers_cpu.py, proxy.py)
share: the test suite's helpers on the path, a process's CPU time, `magnetar perf produce`, and
namespaces and bundles through the admin API. Not a benchmark itself."""

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "compat"))

import conftest  # noqa: E402
from compat_util import http_request  # noqa: E402

# The load manager left alone, so that a benchmark's placement stays as it made it.
FIXED_PLACEMENT = "[load_manager]\nshedding_enabled = false\nauto_bundle_split_enabled = false\n"


def cpu_seconds(pid):
    """User + system CPU seconds of process `pid`, from /proc."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def perf_produce(url, topic, seconds, *extra):
    """One `magnetar perf produce` run of 1 KiB messages (`extra`: more of its flags); the
    publish stream of its JSON report, which must have no errors."""
    cmd = [conftest.magnetar_binary(), "perf", "produce", "-u", url, "-d", str(seconds),
           "-s", "1024", "--json", topic] + list(extra)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    stream = next(s for s in report["streams"] if s["name"] == "publish")
    assert stream["errors"] == 0, stream
    return stream


def broker_id(broker):
    """The id a broker registers under (`host:web port`), as `--destinationBroker` takes it."""
    return broker.web_url.split("://", 1)[1]


def create_namespace(broker, name, bundles=4):
    """`public/<name>-<pid>` with `bundles` bundles, created through `broker`."""
    ns = "public/%s-%d" % (name, os.getpid())
    status, body = http_request("PUT", broker.web_url + "/admin/v2/namespaces/" + ns,
                                json.dumps({"bundles": {"numBundles": bundles}}))
    assert status in (200, 204), body
    return ns


def service_url(brokers):
    """One service URL naming every broker."""
    return "pulsar://" + ",".join(b.service_url[len("pulsar://"):] for b in brokers)


def move_bundles(brokers, ns, destination_of):
    """Unloads every bundle of `ns` to the broker `destination_of(i)` names (a bundle nobody owns
    has nothing to move: place its topics first)."""
    status, body = http_request("GET", "%s/admin/v2/namespaces/%s/bundles"
                                % (brokers[0].web_url, ns))
    assert status == 200, body
    boundaries = json.loads(body)["boundaries"]
    for i, (lo, hi) in enumerate(zip(boundaries, boundaries[1:])):
        status, body = http_request(
            "PUT", "%s/admin/v2/namespaces/%s/%s_%s/unload?destinationBroker=%s"
            % (brokers[0].web_url, ns, lo, hi, broker_id(destination_of(i))))
        assert status in (200, 204), (status, body)


def leader_id(broker):
    """The load manager's leader, as `broker` names it."""
    status, body = http_request("GET", broker.web_url + "/admin/v2/brokers/leaderBroker")
    assert status == 200, body
    return json.loads(body)["brokerId"]
