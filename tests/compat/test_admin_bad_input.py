"""Malformed admin requests on the namespace, topic-policy and broker paths: each must be
refused with a 4xx and a JSON `{"reason": ...}` body (never a 5xx, never a hang), and the
server must keep answering afterwards."""

import json
import uuid

import pytest

from compat_util import http_request

NS = "/admin/v2/namespaces/public/default"
TOPIC = "/admin/v2/persistent/public/default/bad-input-topic"
GHOST_NS = "/admin/v2/namespaces/public/ghost-%s" % uuid.uuid4().hex[:8]

RETENTION_OK = '{"retentionTimeInMinutes":10,"retentionSizeInMB":10}'

# (method, path, body)
CASES = [
    # Namespace policies: malformed bodies, wrong types, out-of-range values.
    ("POST", NS + "/retention", "{"),
    ("POST", NS + "/retention", "[]"),
    ("POST", NS + "/retention", ""),
    ("POST", NS + "/retention", '{"retentionTimeInMinutes":"ten","retentionSizeInMB":1}'),
    ("POST", NS + "/retention", '{"retentionTimeInMinutes":-5,"retentionSizeInMB":1}'),
    ("POST", NS + "/retention", '{"retentionTimeInMinutes":10,"retentionSizeInMB":-7}'),
    ("POST", NS + "/retention", '{"retentionTimeInMinutes":0,"retentionSizeInMB":10}'),
    ("POST", NS + "/retention", '{"retentionTimeInMinutes":10,"retentionSizeInMB":0}'),
    ("POST", NS + "/retention", '{"retentionTimeInMinutes":1e99,"retentionSizeInMB":1}'),
    ("POST", NS + "/messageTTL", "-1"),
    ("POST", NS + "/messageTTL", "abc"),
    ("POST", NS + "/messageTTL", "1.5"),
    ("POST", NS + "/messageTTL", "99999999999"),
    ("POST", NS + "/messageTTL", '{"ttl":5}'),
    ("POST", NS + "/messageTTL", ""),
    ("POST", NS + "/deduplication", "maybe"),
    ("POST", NS + "/deduplication", "1"),
    ("POST", NS + "/maxProducersPerTopic", "-3"),
    ("POST", NS + "/maxConsumersPerTopic", "-3"),
    ("POST", NS + "/maxConsumersPerSubscription", "-1"),
    ("POST", NS + "/maxUnackedMessagesPerConsumer", "-1"),
    ("POST", NS + "/maxUnackedMessagesPerSubscription", "\"x\""),
    ("POST", NS + "/maxTopicsPerNamespace", "-2"),
    ("POST", NS + "/subscriptionExpirationTime", "-2"),
    ("POST", NS + "/backlogQuota", '{"limitSize":1,"policy":"explode"}'),
    ("POST", NS + "/backlogQuota", '{"limitSize":"big","policy":"producer_exception"}'),
    ("POST", NS + "/backlogQuota", '{"limitSize":1}'),
    ("POST", NS + "/backlogQuota?backlogQuotaType=galactic",
     '{"limitSize":1,"policy":"producer_exception"}'),
    ("DELETE", NS + "/backlogQuota?backlogQuotaType=galactic", None),
    ("POST", NS + "/dispatchRate", '{"dispatchThrottlingRateInMsg":"fast"}'),
    ("POST", NS + "/dispatchRate", "17"),
    ("POST", NS + "/subscriptionDispatchRate", "[1,2]"),
    ("POST", NS + "/publishRate", '{"publishThrottlingRateInMsg":[]}'),
    ("POST", NS + "/inactiveTopicPolicies", '{"inactiveTopicDeleteMode":"sometimes",'
     '"maxInactiveDurationSeconds":1,"deleteWhileInactive":true}'),
    ("POST", NS + "/inactiveTopicPolicies", '{}'),
    ("POST", NS + "/autoTopicCreation", '{"allowAutoTopicCreation":true,"topicType":"weird"}'),
    ("POST", NS + "/autoTopicCreation",
     '{"allowAutoTopicCreation":true,"topicType":"partitioned","defaultNumPartitions":0}'),
    ("POST", NS + "/autoSubscriptionCreation", '{"allowAutoSubscriptionCreation":"yes"}'),
    ("PUT", NS + "/schemaCompatibilityStrategy", '"SIDEWAYS"'),
    ("PUT", NS + "/properties", '{"a":1}'),
    ("PUT", NS + "/properties", '"text"'),
    ("POST", NS + "/persistence", '{"bookkeeperEnsemble":0,"bookkeeperWriteQuorum":0,'
     '"bookkeeperAckQuorum":0}'),
    ("POST", NS + "/persistence", '{"bookkeeperEnsemble":2,"bookkeeperWriteQuorum":3,'
     '"bookkeeperAckQuorum":1}'),
    ("POST", NS + "/persistence", '{"bookkeeperEnsemble":"two"}'),
    ("PUT", NS + "/compactionThreshold", "-1"),
    ("PUT", NS + "/offloadThreshold", "lots"),
    ("PUT", NS + "/offloadDeletionLagMs", "{}"),
    ("POST", NS + "/persistence/bookieAffinity", '{"bookkeeperAffinityGroupPrimary":5}'),
    ("POST", NS + "/permissions/someone", '["produce","teleport"]'),
    ("POST", NS + "/permissions/someone", '{"produce":true}'),
    ("POST", NS + "/permissions/subscription/sub1", '"role"'),
    ("PUT", NS + "/0xzz_0xffffffff/unload", None),
    ("PUT", NS + "/0x00000000_0x0000ffff/unload", None),
    # Missing namespace / bad names.
    ("GET", GHOST_NS + "/retention", None),
    ("POST", GHOST_NS + "/messageTTL", "10"),
    ("POST", GHOST_NS + "/backlogQuota", '{"limitSize":1,"policy":"producer_exception"}'),
    ("GET", GHOST_NS + "/permissions", None),
    ("PUT", GHOST_NS + "/unload", None),
    ("GET", GHOST_NS + "/bundles", None),
    ("DELETE", GHOST_NS + "?force=true", None),
    ("POST", "/admin/v2/namespaces/public/bad%20name/messageTTL", "10"),
    ("GET", "/admin/v2/namespaces/public/bad%20name/retention", None),
    ("PUT", "/admin/v2/namespaces/public/ns-%s" % uuid.uuid4().hex[:6],
     '{"message_ttl_in_seconds":"soon"}'),
    ("PUT", "/admin/v2/namespaces/public/ns-%s" % uuid.uuid4().hex[:6],
     '{"bundles":{"numBundles":0}}'),
    ("PUT", "/admin/v2/namespaces/public/ns-%s" % uuid.uuid4().hex[:6],
     '{"retention_policies":{"retentionTimeInMinutes":0,"retentionSizeInMB":5}}'),
    ("DELETE", "/admin/v2/tenants/ghost-%s?force=true" % uuid.uuid4().hex[:6], None),
    # Topic policies.
    ("POST", TOPIC + "/retention", "{not json"),
    ("POST", TOPIC + "/retention", '{"retentionTimeInMinutes":-9,"retentionSizeInMB":-1}'),
    ("POST", TOPIC + "/messageTTL?messageTTL=-5", None),
    ("POST", TOPIC + "/messageTTL?messageTTL=soon", None),
    ("POST", TOPIC + "/messageTTL", None),
    ("POST", TOPIC + "/maxProducers", "-1"),
    ("POST", TOPIC + "/maxConsumers", "x"),
    ("POST", TOPIC + "/maxUnackedMessagesOnConsumer", "-4"),
    ("POST", TOPIC + "/maxUnackedMessagesOnSubscription", "[]"),
    ("POST", TOPIC + "/maxConsumersPerSubscription", "-1"),
    ("POST", TOPIC + "/maxMessageSize", "-1"),
    ("POST", TOPIC + "/maxMessageSize", "2147483647"),
    ("POST", TOPIC + "/dispatchRate", '{"ratePeriodInSecond":"x"}'),
    ("POST", TOPIC + "/subscribeRate", '{"subscribeThrottlingRatePerConsumer":"x"}'),
    ("POST", TOPIC + "/publishRate", "null"),
    ("POST", TOPIC + "/backlogQuota?backlogQuotaType=nope",
     '{"limitSize":1,"policy":"producer_exception"}'),
    ("POST", TOPIC + "/backlogQuota", '{"policy":42}'),
    ("POST", TOPIC + "/deduplicationEnabled", '"perhaps"'),
    ("POST", TOPIC + "/compactionThreshold", "-10"),
    ("POST", TOPIC + "/persistence", '{"bookkeeperEnsemble":9,"bookkeeperWriteQuorum":1,'
     '"bookkeeperAckQuorum":1}'),
    ("POST", TOPIC + "/inactiveTopicPolicies", "true"),
    ("GET", "/admin/v2/persistent/public/ghost-ns/t/retention", None),
    ("POST", "/admin/v2/persistent/public/ghost-ns/t/messageTTL?messageTTL=5", None),
    ("GET", "/admin/v2/persistent/pub%20lic/default/t/retention", None),
    ("POST", "/admin/v2/non-persistent/public/default/t/maxProducers", "-9"),
    # Broker configuration.
    ("POST", "/admin/v2/brokers/configuration/noSuchSetting/5", None),
    ("DELETE", "/admin/v2/brokers/configuration/noSuchSetting", None),
]


def _check(server, method, path, body):
    status, raw = http_request(method, server.web_url + path, body)
    where = "%s %s %r" % (method, path, body)
    assert 400 <= status < 500, "%s answered %d: %r" % (where, status, raw[:300])
    try:
        reason = json.loads(raw)["reason"]
    except (ValueError, KeyError, TypeError):
        pytest.fail("%s answered %d without a JSON reason: %r" % (where, status, raw[:300]))
    assert isinstance(reason, str) and reason, where
    return status


def test_malformed_admin_requests_get_4xx_with_a_reason(server):
    assert len(CASES) >= 50
    # A retention the backlog-quota checks can trip over, then a quota above it.
    status, body = http_request("POST", server.web_url + NS + "/retention", RETENTION_OK)
    assert status == 204, body
    try:
        too_big = '{"limitSize":%d,"policy":"producer_exception"}' % (20 << 20)
        assert _check(server, "POST", NS + "/backlogQuota", too_big) == 412
        statuses = {}
        for method, path, body in CASES:
            statuses[(method, path, body)] = _check(server, method, path, body)
        # A few exact statuses, as Pulsar answers them.
        assert statuses[("POST", NS + "/messageTTL", "-1")] == 412
        assert statuses[("GET", GHOST_NS + "/retention", None)] == 404
        assert statuses[("POST", NS + "/retention",
                         '{"retentionTimeInMinutes":0,"retentionSizeInMB":10}')] == 400
        assert statuses[("POST", "/admin/v2/brokers/configuration/noSuchSetting/5", None)] == 412
    finally:
        http_request("DELETE", server.web_url + NS + "/retention")
    # Still serving, and nothing bad was stored.
    status, body = http_request("GET", server.web_url + NS)
    assert status == 200, body
    policies = json.loads(body)
    assert "message_ttl_in_seconds" not in policies
    assert policies.get("backlog_quota_map", {}) == {}
    status, body = http_request("GET", server.web_url + "/admin/v2/brokers/health")
    assert status == 200 and body == b"ok"
