"""Non-persistent topics: at-most-once in-memory fan-out, no backlog, nothing stored
(Pulsar's NonPersistentTopic)."""

import time
import uuid

import pulsar
import pytest

from compat_util import assert_nothing_more, http_request, receive_n, short_name


def np_topic(prefix="np"):
    return "non-persistent://public/default/%s-%s" % (prefix, uuid.uuid4().hex)


def _payloads(messages):
    return [m.data().decode() for m in messages]


def _producer(client, topic):
    return client.create_producer(topic, batching_enabled=False)


def test_produce_consume_and_fan_out(client):
    topic = np_topic()
    a = client.subscribe(topic, "a", consumer_type=pulsar.ConsumerType.Exclusive)
    b = client.subscribe(topic, "b", consumer_type=pulsar.ConsumerType.Failover)
    producer = _producer(client, topic)
    for i in range(20):
        producer.send(("m%d" % i).encode())
    expected = ["m%d" % i for i in range(20)]
    got_a = receive_n(a, 20)
    assert _payloads(got_a) == expected
    assert _payloads(receive_n(b, 20)) == expected
    for m in got_a:
        a.acknowledge(m)  # accepted (and ignored)
    assert_nothing_more(a)


def test_shared_splits(client):
    topic = np_topic("np-shared")
    c1 = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    c2 = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    producer = _producer(client, topic)
    n = 40
    for i in range(n):
        producer.send(("m%d" % i).encode())
    got1, got2 = [], []
    while len(got1) + len(got2) < n:
        progressed = False
        for consumer, got in ((c1, got1), (c2, got2)):
            try:
                got.append(consumer.receive(timeout_millis=2000).data().decode())
                progressed = True
            except pulsar.Timeout:
                pass
        assert progressed, "only %d of %d messages arrived" % (len(got1) + len(got2), n)
    assert got1 and got2, "one consumer got everything"
    assert sorted(got1 + got2) == sorted("m%d" % i for i in range(n))
    assert_nothing_more(c1)
    assert_nothing_more(c2)


def test_key_shared_keeps_keys_on_one_consumer(client):
    topic = np_topic("np-ks")
    c1 = client.subscribe(topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared)
    c2 = client.subscribe(topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared)
    producer = _producer(client, topic)
    n = 60
    for i in range(n):
        producer.send(("m%d" % i).encode(), partition_key="key-%d" % (i % 12))
    owners = {}
    received = 0
    # Short polls of both consumers (one may get far fewer keys than the other), bounded by a
    # deadline that moves on with every message.
    deadline = time.monotonic() + 10
    while received < n:
        assert time.monotonic() < deadline, "only %d of %d messages arrived" % (received, n)
        for index, consumer in enumerate((c1, c2)):
            try:
                m = consumer.receive(timeout_millis=100)
            except pulsar.Timeout:
                continue
            deadline = time.monotonic() + 10
            received += 1
            assert owners.setdefault(m.partition_key(), index) == index, "key moved"
    assert len(owners) == 12


def test_no_backlog_for_late_subscribers(client):
    topic = np_topic("np-late")
    producer = _producer(client, topic)
    producer.send(b"before anyone subscribed")
    late = client.subscribe(topic, "late", initial_position=pulsar.InitialPosition.Earliest)
    assert_nothing_more(late)
    producer.send(b"after")
    assert receive_n(late, 1)[0].data() == b"after"


def test_admin_lists_live_topic_and_partitions(server, client):
    topic = np_topic("np-admin")
    producer = _producer(client, topic)
    producer.send(b"x")
    status, body = http_request("GET", "%s/admin/v2/non-persistent/public/default" % server.web_url)
    assert status == 200, body
    assert topic.encode() in body

    base = np_topic("np-part")
    url = "%s/admin/v2/non-persistent/public/default/%s/partitions" % (
        server.web_url, short_name(base))
    status, body = http_request("PUT", url, "2")
    assert status in (200, 204), body
    consumer = client.subscribe(base, "s")
    producer = client.create_producer(base, batching_enabled=False)
    for i in range(10):
        producer.send(("m%d" % i).encode(), partition_key="k%d" % i)
    got = receive_n(consumer, 10)
    assert sorted(_payloads(got)) == sorted("m%d" % i for i in range(10))


@pytest.mark.restarts_server
def test_nothing_survives_restart(server):
    topic = np_topic("np-restart")
    c1 = server.client()
    try:
        consumer = c1.subscribe(topic, "s")
        producer = _producer(c1, topic)
        producer.send(b"lost")
        receive_n(consumer, 1)  # received, never acknowledged
    finally:
        c1.close()
    server.restart(graceful=True)
    c2 = server.client()
    try:
        status, body = http_request("GET", "%s/admin/v2/non-persistent/public/default"
                                    % server.web_url)
        assert status == 200 and topic.encode() not in body
        consumer = c2.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        assert_nothing_more(consumer)
    finally:
        c2.close()


def test_consumer_limits_apply(server, client):
    """The topic's `maxConsumers` policy (Pulsar checks it on non-persistent topics too): the
    consumer one too many is refused with ConsumerBusy."""
    topic = np_topic("np-max-consumers")
    url = "%s/admin/v2/non-persistent/public/default/%s/maxConsumers" % (
        server.web_url, short_name(topic))
    status, body = http_request("POST", url, "1")
    assert status in (200, 204), (status, body)
    first = client.subscribe(topic, "a", consumer_type=pulsar.ConsumerType.Shared)
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "b", consumer_type=pulsar.ConsumerType.Shared)
    first.close()
    client.subscribe(topic, "b", consumer_type=pulsar.ConsumerType.Shared).close()
