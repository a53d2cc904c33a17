"""Apache's `pulsar-admin` CLI against the namespace, topic-policy, cluster and broker endpoints:
what operators type, with the printed values checked (not only exit codes).

Commands run one after another in one JVM (`pulsar_admin.PulsarAdmin`)."""

import json
import uuid
import zlib

import pulsar
import pytest

from compat_util import eventually, http_request
from pulsar_admin import PulsarAdmin, requires_pulsar_admin

pytestmark = requires_pulsar_admin

def _all(admin, *commands):
    """Runs the commands (tuples of arguments); returns their stdouts in order."""
    return [admin(*args) for args in commands]


def _sequences(*sequences):
    """Runs each callable (a sequence of dependent commands), one after the other."""
    for sequence in sequences:
        sequence()


def _json(text):
    return json.loads(text)


@pytest.fixture(scope="module")
def admin(server):
    return PulsarAdmin(server.web_url)


def test_the_cli_as_its_own_process(admin):
    """The other tests run commands in one JVM; the CLI as operators start it (its `main`, which
    ends the process with the command's exit code) answers the same."""
    listed = admin.run_process("tenants", "list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == admin("tenants", "list").split()
    refused = admin.run_process("tenants", "get", "no-such-tenant")
    assert refused.returncode != 0 and "does not exist" in refused.stderr, refused


def test_clusters_and_brokers(admin, server):
    clusters, cluster, brokers, health, leader, active, dyn = _all(
        admin,
        ("clusters", "list"),
        ("clusters", "get", "standalone"),
        ("brokers", "list", "standalone"),
        ("brokers", "healthcheck"),
        ("brokers", "leader-broker"),
        ("brokers", "get-runtime-config"),
        ("brokers", "list-dynamic-config"),
    )
    assert clusters.split() == ["standalone"]
    assert _json(cluster)["serviceUrl"] == server.web_url
    web_host_port = server.web_url.split("://", 1)[1]
    port = web_host_port.rsplit(":", 1)[1]
    assert [b for b in brokers.split() if b.endswith(":" + port)], brokers
    assert "ok" in health
    assert _json(leader)["serviceUrl"].endswith(":" + port), leader
    # Maps print as "key    value" lines.
    assert "clusterName    standalone" in active, active
    assert "allowAutoSubscriptionCreation" in dyn.split(), dyn
    out = admin.fails("brokers", "update-dynamic-config", "-c", "noSuchSetting", "-v", "1")
    assert "non-dynamic" in out, out


def test_dynamic_config_update_applies_at_run_time(admin, server):
    # `brokers update-dynamic-config allowAutoSubscriptionCreation false`: stored, listed, and
    # what a topic obeys from then on (its applied autoSubscriptionCreation); deleted, the
    # configuration file's value (true) is back.
    topic = "persistent://public/default/dyn-%s" % uuid.uuid4().hex[:8]
    admin("topics", "create", topic)
    applied = "/admin/v2/persistent/public/default/%s/autoSubscriptionCreation?applied=true" % (
        topic.rsplit("/", 1)[1])
    admin("brokers", "update-dynamic-config", "-c", "allowAutoSubscriptionCreation", "-v", "false")
    # (Pulsar's brokers apply it from a metadata watch, a moment later: waited for, bounded.)
    try:
        values = admin("brokers", "get-all-dynamic-config")
        assert "allowAutoSubscriptionCreation    false" in values, values
        eventually("applied to the topic", lambda: _http_json(server, applied)
                   == {"allowAutoSubscriptionCreation": False})
        runtime = admin("brokers", "get-runtime-config")
        assert "allowAutoSubscriptionCreation    false" in runtime, runtime
    finally:
        admin("brokers", "delete-dynamic-config", "-c", "allowAutoSubscriptionCreation")
    eventually("back to the file's value", lambda: _http_json(server, applied)
               == {"allowAutoSubscriptionCreation": True})
    assert "allowAutoSubscriptionCreation" not in admin("brokers", "get-all-dynamic-config")


def _http_json(server, path):
    status, body = http_request("GET", server.web_url + path)
    assert status == 200, (path, status, body)
    return json.loads(body)


def test_namespace_policies_round_trip(admin, server):
    ns = "public/cli-%s" % uuid.uuid4().hex[:8]
    admin("namespaces", "create", ns, "-b", "4")
    policies, bundles = _all(admin, ("namespaces", "policies", ns),
                                  ("namespaces", "bundles", ns))
    assert _json(policies)["bundles"]["numBundles"] == 4
    assert _json(policies)["replication_clusters"] == ["standalone"]
    assert _json(bundles)["boundaries"][0] == "0x00000000"
    assert _json(bundles)["boundaries"][-1] == "0xffffffff"
    assert len(_json(bundles)["boundaries"]) == 5

    def retention_and_quotas():
        admin("namespaces", "set-retention", ns, "-t", "1h", "-s", "1G")
        assert _json(admin("namespaces", "get-retention", ns)) == {
            "retentionTimeInMinutes": 60, "retentionSizeInMB": 1024}
        # A size quota above the retention size is refused with Pulsar's reason.
        out = admin.fails("namespaces", "set-backlog-quota", ns, "-l", "2G",
                          "-p", "producer_request_hold")
        assert "Backlog Quota exceeds configured retention quota" in out, out
        admin("namespaces", "set-backlog-quota", ns, "-l", "10M", "-p", "producer_request_hold")
        admin("namespaces", "set-backlog-quota", ns, "-lt", "30m", "-p", "producer_exception",
              "-t", "message_age")
        # Maps print as "key    value" lines (the quotas' toString).
        quotas = dict(line.split(None, 1) for line in
                      admin("namespaces", "get-backlog-quotas", ns).strip().splitlines())
        assert "limitSize=10485760" in quotas["destination_storage"], quotas
        assert "policy=producer_request_hold" in quotas["destination_storage"], quotas
        assert "limitTime=1800" in quotas["message_age"], quotas
        assert "policy=producer_exception" in quotas["message_age"], quotas
        admin("namespaces", "remove-backlog-quota", ns, "-t", "message_age")
        assert list(_http_json(server, "/admin/v2/namespaces/%s/backlogQuotaMap" % ns)) == [
            "destination_storage"]
        admin("namespaces", "remove-retention", ns)
        assert admin("namespaces", "get-retention", ns).strip() == "null"

    def ttl_and_dedup():
        out = admin.fails("namespaces", "set-message-ttl", ns, "-ttl", "-5")
        assert "Invalid value for message TTL" in out, out
        admin("namespaces", "set-message-ttl", ns, "-ttl", "120")
        assert admin("namespaces", "get-message-ttl", ns).strip() == "120"
        admin("namespaces", "set-deduplication", ns, "--enable")
        admin("namespaces", "remove-message-ttl", ns)
        assert admin("namespaces", "get-message-ttl", ns).strip() == "null"

    def limits():
        admin("namespaces", "set-max-producers-per-topic", ns, "-p", "5")
        admin("namespaces", "set-max-consumers-per-topic", ns, "-c", "6")
        admin("namespaces", "set-max-consumers-per-subscription", ns, "-c", "7")
        admin("namespaces", "set-max-unacked-messages-per-consumer", ns, "-c", "8")
        admin("namespaces", "set-max-unacked-messages-per-subscription", ns, "-c", "9")
        assert admin("namespaces", "get-max-producers-per-topic", ns).strip() == "5"

    def rates():
        admin("namespaces", "set-dispatch-rate", ns, "-md", "100", "-bd", "1000", "-dt", "2")
        admin("namespaces", "set-publish-rate", ns, "-m", "10", "-b", "2048")
        admin("namespaces", "set-inactive-topic-policies", ns, "-e", "-t", "1h",
              "-m", "delete_when_no_subscriptions")
        rate = _json(admin("namespaces", "get-dispatch-rate", ns))
        assert (rate["dispatchThrottlingRateInMsg"], rate["dispatchThrottlingRateInByte"],
                rate["ratePeriodInSecond"]) == (100, 1000, 2)
        inactive = _json(admin("namespaces", "get-inactive-topic-policies", ns))
        assert inactive == {"inactiveTopicDeleteMode": "delete_when_no_subscriptions",
                            "maxInactiveDurationSeconds": 3600, "deleteWhileInactive": True}

    def schema_policies():
        # Unset: Pulsar's defaults (auto update allowed, validation not enforced).
        assert admin("namespaces", "get-is-allow-auto-update-schema", ns).strip() == "true"
        assert admin("namespaces", "get-schema-validation-enforce", ns).strip() == "false"
        admin("namespaces", "set-is-allow-auto-update-schema", ns, "--disable")
        admin("namespaces", "set-schema-validation-enforce", ns, "--enable")
        assert admin("namespaces", "get-is-allow-auto-update-schema", ns).strip() == "false"
        assert admin("namespaces", "get-schema-validation-enforce", ns).strip() == "true"

    _sequences(retention_and_quotas, ttl_and_dedup, limits, rates, schema_policies)

    p = _json(admin("namespaces", "policies", ns))
    assert p["deduplicationEnabled"] is True
    assert p["max_producers_per_topic"] == 5
    assert p["max_consumers_per_topic"] == 6
    assert p["max_consumers_per_subscription"] == 7
    assert p["max_unacked_messages_per_consumer"] == 8
    assert p["max_unacked_messages_per_subscription"] == 9
    assert p["publishMaxMessageRate"]["standalone"] == {
        "publishThrottlingRateInMsg": 10, "publishThrottlingRateInByte": 2048}
    assert p["topicDispatchRate"]["standalone"]["dispatchThrottlingRateInMsg"] == 100
    assert "retention_policies" not in p or p["retention_policies"] is None
    assert (p["is_allow_auto_update_schema"], p["schema_validation_enforced"]) == (False, True)
    # Both are honoured. Auto update off: a topic's first schema is not added either.
    topic = "persistent://%s/schema-policies" % ns
    client = server.client()
    try:
        with pytest.raises(pulsar.IncompatibleSchema):
            client.create_producer(topic, schema=pulsar.schema.StringSchema())
        admin("namespaces", "set-is-allow-auto-update-schema", ns, "--enable")
        client.create_producer(topic, schema=pulsar.schema.StringSchema()).close()
        # Validation enforced: a producer without a schema is refused on a topic with one.
        with pytest.raises(pulsar.IncompatibleSchema):
            client.create_producer(topic)
    finally:
        client.close()
    admin("namespaces", "delete", ns, "--force")


def test_permissions_unload_and_deletes(admin, server):
    tenant = "cli-tenant-%s" % uuid.uuid4().hex[:8]
    ns = tenant + "/ns"
    admin("tenants", "create", tenant, "-c", "standalone")
    admin("namespaces", "create", ns)
    admin("namespaces", "grant-permission", ns, "--role", "app", "--actions", "produce,consume")
    admin("namespaces", "grant-subscription-permission", ns, "-s", "sub1", "-rs", "app,ops")
    perms, sub_perms = _all(admin, ("namespaces", "permissions", ns),
                                 ("namespaces", "subscription-permission", ns))
    # Maps print as "key    value" lines.
    assert perms.strip() in ("app    [produce, consume]", "app    [consume, produce]"), perms
    assert sub_perms.strip() in ("sub1    [app, ops]", "sub1    [ops, app]"), sub_perms
    admin("namespaces", "revoke-permission", ns, "--role", "app")
    assert admin("namespaces", "permissions", ns).strip() == ""

    # A topic with a live producer: unload closes it (the client reconnects and goes on).
    topic = "persistent://%s/t1" % ns
    client = pulsar.Client(server.service_url)
    try:
        producer = client.create_producer(topic)
        producer.send(b"before")
        # New namespaces have Pulsar's 4 bundles: unload the topic's own.
        bundle = admin("topics", "bundle-range", topic).strip()
        assert bundle in ("0x00000000_0x40000000", "0x40000000_0x80000000",
                          "0x80000000_0xc0000000", "0xc0000000_0xffffffff"), bundle
        _all(admin, ("namespaces", "unload", ns),
                  ("namespaces", "unload", ns, "-b", bundle))
        producer.send(b"after")  # reconnected
        out = admin.fails("namespaces", "delete", ns)
        assert "Cannot delete non empty namespace" in out, out
        out = admin.fails("tenants", "delete", tenant)
        assert "still has active namespaces" in out, out
    finally:
        client.close()
    admin("namespaces", "create", tenant + "/ns2")
    admin("namespaces", "delete", "-f", ns)
    assert admin("namespaces", "list", tenant).split() == [tenant + "/ns2"]
    admin("tenants", "delete", "-f", tenant)
    status, _ = http_request("GET", server.web_url + "/admin/v2/tenants/" + tenant)
    assert status == 404


def test_topic_policies(admin, server):
    name = "cli-topic-%s" % uuid.uuid4().hex[:8]
    topic = "persistent://public/default/" + name
    admin("topics", "create", topic)

    def retention():
        admin("topicPolicies", "set-retention", topic, "-t", "2h", "-s", "512M")
        assert _json(admin("topicPolicies", "get-retention", topic)) == {
            "retentionTimeInMinutes": 120, "retentionSizeInMB": 512}
        admin("topicPolicies", "remove-retention", topic)
        # Applied: the namespace's or the broker's (no retention).
        applied = _json(admin("topicPolicies", "get-retention", "-ap", topic))
        assert applied["retentionTimeInMinutes"] == 0, applied
        admin("topics", "set-retention", topic, "-t", "10m", "-s", "100M")
        assert _json(admin("topics", "get-retention", topic))["retentionTimeInMinutes"] == 10

    def ttl_and_limits():
        admin("topicPolicies", "set-message-ttl", topic, "-t", "45")
        assert admin("topicPolicies", "get-message-ttl", topic).strip() == "45"
        admin("topicPolicies", "set-max-producers", topic, "-p", "3")
        assert admin("topicPolicies", "get-max-producers", topic).strip() == "3"
        out = admin.fails("topicPolicies", "set-max-producers", topic, "-p", "-1")
        assert "must be 0 or more" in out, out

    def quota():
        admin("topicPolicies", "set-backlog-quota", topic, "-l", "1M", "-p", "producer_exception")
        quotas = admin("topicPolicies", "get-backlog-quota", topic)
        assert "limitSize=1048576" in quotas and "producer_exception" in quotas, quotas
        admin("topicPolicies", "set-deduplication", topic, "--enable")
        assert admin("topicPolicies", "get-deduplication", topic).strip() == "true"

    def schema_strategy():
        admin("topicPolicies", "set-schema-compatibility-strategy", topic, "-s", "BACKWARD_TRANSITIVE")
        got = admin("topicPolicies", "get-schema-compatibility-strategy", topic).strip().strip('"')
        assert got == "BACKWARD_TRANSITIVE", got
        admin("topicPolicies", "remove-schema-compatibility-strategy", topic)
        got = admin("topicPolicies", "get-schema-compatibility-strategy", topic).strip()
        assert got in ("null", ""), got

    _sequences(retention, ttl_and_limits, quota, schema_strategy)
    admin("topics", "delete", topic)


def test_bundle_range_and_split_bundle(admin, server):
    """`topics bundle-range`: the bundle a topic hashes into, Pulsar's CRC32 (IEEE) of its full
    name into the namespace's ranges (4 even ones here); `namespaces split-bundle` by range and
    by topic count."""
    tenant = "cli-bundles-%s" % uuid.uuid4().hex[:8]
    ns = tenant + "/ns"
    admin("tenants", "create", tenant, "-c", "standalone")
    admin("namespaces", "create", ns, "--bundles", "4")
    bounds = [0x00000000, 0x40000000, 0x80000000, 0xc0000000, 0xffffffff]
    topics = ["persistent://%s/t-%d" % (ns, i) for i in range(6)]
    ranges = _all(admin, *[("topics", "bundle-range", t) for t in topics])
    for topic, got in zip(topics, ranges):
        h = zlib.crc32(topic.encode())
        i = max(k for k in range(4) if bounds[k] <= h)
        assert got.strip() == "0x%08x_0x%08x" % (bounds[i], bounds[i + 1]), (topic, hex(h), got)
    # split-bundle: at the middle of the range (range_equally_divide, Pulsar's default).
    admin("namespaces", "split-bundle", ns, "-b", "0x00000000_0x40000000")
    bundles = _json(admin("namespaces", "bundles", ns))
    assert bundles["boundaries"] == ["0x00000000", "0x20000000", "0x40000000", "0x80000000",
                                     "0xc0000000", "0xffffffff"], bundles
    assert bundles["numBundles"] == 5
    base = server.web_url + "/admin/v2/namespaces/" + ns
    status, body = http_request("PUT", base + "/0x00000000_0x40000000/split", body=b"")
    assert status == 404, (status, body)  # no longer one of its bundles
    status, body = http_request("PUT", base + "/0x4000_0x8000/split", body=b"")
    assert status == 412, (status, body)
    status, body = http_request(
        "PUT", base + "/0x40000000_0x80000000/split?splitAlgorithmName=nope", body=b"")
    assert status == 412 and b"split algorithm" in body, (status, body)
    # topic_count_equally_divide: between the two middle topics' hashes of the bundle.
    candidates = ("persistent://%s/c-%d" % (ns, i) for i in range(1000))
    chosen = [t for t in candidates if 0x80000000 <= zlib.crc32(t.encode()) < 0xc0000000][:3]
    for t in chosen:
        admin("topics", "create", t)
    admin("namespaces", "split-bundle", ns, "-b", "0x80000000_0xc0000000",
          "-san", "topic_count_equally_divide")
    in_bundle = sorted(zlib.crc32(t.encode()) for t in chosen)
    start, end = in_bundle[len(in_bundle) // 2 - 1], in_bundle[len(in_bundle) // 2]
    middle = "0x%08x" % (start + (end - start) // 2)
    assert middle in _json(admin("namespaces", "bundles", ns))["boundaries"], middle
    admin("namespaces", "delete", "-f", ns)
    admin("tenants", "delete", "-f", tenant)
