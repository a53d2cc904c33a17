"""Topic-level policies Magnetar enforces, set through the admin API as pulsar-admin
`topicPolicies` does, and met with the official Python client. Pulsar applies topic policies
asynchronously (through its system topic), so each effect is waited for, bounded; Magnetar
applies them before the admin call returns.

- maxSubscriptionsPerTopic: one subscription too many is refused with NotAllowed ("Exceed the
  maximum number of subscriptions of the topic");
- autoSubscriptionCreation false: a consumer cannot create a durable subscription
  (SubscriptionNotFound "Subscription does not exist"), existing ones and readers still work, and
  allowed (the default), a peek on a missing subscription creates it at the earliest message, as
  Pulsar's findOrCreateSubscriptionAsync does (which later 4.0 releases refuse with 412 while
  creation is off, as Magnetar does; 4.0.7 creates it regardless);
- delayedDelivery inactive: a message with a delivery time goes out at once.
tests/go/admin_topic_ops_test.go reads the same policies back through the Go admin client."""

import json
from datetime import timedelta

import pulsar
import pytest

import pulsar_wire as wire
import raw_frames as raw
from compat_util import eventually, http_request, payloads, receive_n, short_name, unique_topic

SUBSCRIPTION_NOT_FOUND = 12  # ServerError


def _policy_url(server, topic, policy):
    return "%s/admin/v2/persistent/public/default/%s/%s" % (server.web_url, short_name(topic),
                                                           policy)


def _set(server, topic, policy, body):
    status, reply = http_request("POST", _policy_url(server, topic, policy), json.dumps(body))
    assert status in (200, 204), (policy, status, reply)


def _subscribes(client, topic, name):
    try:
        client.subscribe(topic, name).close()
        return True
    except (pulsar.NotAllowedError, pulsar.Timeout):
        return False


def test_max_subscriptions_per_topic(client, server):
    topic = unique_topic("policy-max-subs")
    client.create_producer(topic).close()
    client.subscribe(topic, "s1").close()
    _set(server, topic, "maxSubscriptionsPerTopic", 2)
    client.subscribe(topic, "s2").close()
    eventually("the limit refuses a third subscription", lambda: not _subscribes(client, topic, "s3"))
    with pytest.raises(pulsar.NotAllowedError):
        client.subscribe(topic, "s3")
    client.subscribe(topic, "s1").close()  # an existing one is no new subscription
    status, _ = http_request("DELETE", _policy_url(server, topic, "maxSubscriptionsPerTopic"))
    assert status in (200, 204)
    eventually("the limit removed", lambda: _subscribes(client, topic, "s3"))


def test_auto_subscription_creation_off_and_peek_creating_the_subscription(client, server):
    topic = unique_topic("policy-auto-sub")
    producer = client.create_producer(topic, batching_enabled=False)
    client.subscribe(topic, "existing").close()
    for i in range(3):
        producer.send(("m-%d" % i).encode(), properties={"k": "v%d" % i})
    _set(server, topic, "autoSubscriptionCreation", {"allowAutoSubscriptionCreation": False})
    # The broker answers SubscriptionNotFound, which the C++-based client retries until its
    # operation timeout (so does it against Pulsar): the answer itself is read off the wire.
    def refused():
        with wire.RawConnection(server.service_url) as conn:
            conn.handshake()
            raw.lookup(conn, topic, 1)
            conn.send(raw.subscribe_frame(topic, "fresh", 1, 2, raw.SHARED, "c"))
            type_, fields = conn.read_frame(timeout=5)
            return fields if type_ == wire.ERROR else None
    error = eventually("a new subscription refused", refused)
    assert error[2] == [SUBSCRIPTION_NOT_FOUND], error
    assert error[3] == [b"Subscription does not exist"], error
    existing = client.subscribe(topic, "existing")
    assert payloads(receive_n(existing, 3)) == ["m-0", "m-1", "m-2"]
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert reader.read_next(timeout_millis=10_000).data() == b"m-0"
    status, _ = http_request("DELETE", _policy_url(server, topic, "autoSubscriptionCreation"))
    assert status in (200, 204)
    # (A refused subscribe is retried by the client until its operation timeout: a short one.)
    quick = pulsar.Client(server.service_url, operation_timeout_seconds=2)
    try:
        eventually("consumers may create subscriptions again",
                lambda: _subscribes(quick, topic, "again"), deadline_s=20)
    finally:
        quick.close()
    status, body = http_request("GET", _policy_url(server, topic, "subscription/peeked/position/1"))
    assert status == 200 and body == b"m-0", (status, body)
    status, body = http_request("GET", _policy_url(server, topic, "subscriptions"))
    assert status == 200 and "peeked" in json.loads(body), body


def test_delayed_delivery_inactive_delivers_at_once(client, server):
    topic = unique_topic("policy-no-delay")
    client.create_producer(topic).close()
    _set(server, topic, "delayedDelivery", {"active": False, "tickTime": 1000})
    def read_back():
        status, body = http_request("GET", _policy_url(server, topic, "delayedDelivery"))
        return json.loads(body) if status == 200 and body else None
    assert eventually("the policy reads back", read_back)["active"] is False
    consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    producer = client.create_producer(topic)
    producer.send(b"not-held", deliver_after=timedelta(minutes=10))
    assert payloads(receive_n(consumer, 1, timeout_ms=5000)) == ["not-held"]
