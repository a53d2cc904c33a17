"""Partitioned topics: admin REST create/get/grow, key routing, consuming all partitions."""

import json
import re

import pulsar

from compat_util import (RECEIVE_TIMEOUT_MS, assert_nothing_more, http_request, payloads,
                         receive_n, short_name, unique_topic)

PARTITION_RE = re.compile(r"-partition-(\d+)$")


def _partitions_url(server, topic):
    return "%s/admin/v2/persistent/public/default/%s/partitions" % (server.web_url, short_name(topic))


def _create(server, topic, n):
    status, body = http_request("PUT", _partitions_url(server, topic), body=json.dumps(n))
    assert 200 <= status < 300, "create partitioned topic: %s %r" % (status, body)


def _get_partitions(server, topic):
    status, body = http_request("GET", _partitions_url(server, topic))
    assert status == 200, "get partitions: %s %r" % (status, body)
    return json.loads(body)


def _partition_of(msg):
    m = PARTITION_RE.search(msg.topic_name())
    assert m, "message topic %r has no -partition-N suffix" % msg.topic_name()
    return int(m.group(1))


def test_create_and_get_partitioned_metadata(server):
    topic = unique_topic("part-meta")
    _create(server, topic, 4)
    assert _get_partitions(server, topic)["partitions"] == 4
    # creating it again is a conflict
    status, body = http_request("PUT", _partitions_url(server, topic), body="4")
    assert status == 409, (status, body)
    # invalid requests are refused
    for bad in ("0", "-3", '"abc"'):
        status, _ = http_request("PUT", _partitions_url(server, unique_topic("bad")), body=bad)
        assert 400 <= status < 500, "PUT partitions %s answered %s" % (bad, status)
    # a topic that does not exist
    status, _ = http_request("GET", _partitions_url(server, unique_topic("nope")))
    assert status == 404


def test_keyed_messages_stick_to_a_partition_and_consumer_gets_all(client, server):
    topic = unique_topic("part-keys")
    _create(server, topic, 4)
    consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Exclusive,
                                initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    keys = ["key-%d" % k for k in range(16)]
    n = 160
    for i in range(n):
        producer.send(("m-%d" % i).encode(), partition_key=keys[i % len(keys)])
    msgs = receive_n(consumer, n)
    assert sorted(payloads(msgs)) == sorted("m-%d" % i for i in range(n))
    key_to_partitions = {}
    for m in msgs:
        p = _partition_of(m)
        assert 0 <= p < 4
        assert m.topic_name().startswith(topic + "-partition-")
        key_to_partitions.setdefault(m.partition_key(), set()).add(p)
        consumer.acknowledge(m)
    assert all(len(ps) == 1 for ps in key_to_partitions.values()), key_to_partitions
    used = set().union(*key_to_partitions.values())
    assert len(used) > 1, "16 keys all hashed to one partition: %r" % key_to_partitions
    # per key, order is kept (each key lives in one partition)
    for k in keys:
        seq = [int(m.data().decode().split("-")[1]) for m in msgs if m.partition_key() == k]
        assert seq == sorted(seq), (k, seq)
    assert_nothing_more(consumer)


def test_unkeyed_messages_spread_over_partitions(client, server):
    topic = unique_topic("part-rr")
    _create(server, topic, 4)
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(
        topic, batching_enabled=False,
        message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
    for i in range(40):
        producer.send(("m-%d" % i).encode())
    msgs = receive_n(consumer, 40)
    assert sorted(payloads(msgs)) == sorted("m-%d" % i for i in range(40))
    assert {_partition_of(m) for m in msgs} == {0, 1, 2, 3}


def test_each_partition_is_a_topic(client, server):
    topic = unique_topic("part-direct")
    _create(server, topic, 3)
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    for p in range(3):
        client.create_producer("%s-partition-%d" % (topic, p)).send(("to-%d" % p).encode())
    msgs = receive_n(consumer, 3)
    assert sorted((_partition_of(m), m.data().decode()) for m in msgs) == \
        [(0, "to-0"), (1, "to-1"), (2, "to-2")]


def test_grow_partitions(client, server):
    topic = unique_topic("part-grow")
    _create(server, topic, 2)
    status, body = http_request("POST", _partitions_url(server, topic), body="5")
    assert 200 <= status < 300, (status, body)
    assert _get_partitions(server, topic)["partitions"] == 5
    # shrinking is refused and changes nothing
    status, _ = http_request("POST", _partitions_url(server, topic), body="3")
    assert 400 <= status < 500, status
    assert _get_partitions(server, topic)["partitions"] == 5
    # a consumer on the partitioned topic sees the new partitions
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    client.create_producer(topic + "-partition-4").send(b"in-new-partition")
    m = consumer.receive(timeout_millis=RECEIVE_TIMEOUT_MS)
    assert m.data() == b"in-new-partition"
    assert _partition_of(m) == 4
    # and a producer on the partitioned topic spreads over all 5
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(50):
        producer.send(("m-%d" % i).encode())
    msgs = receive_n(consumer, 50)
    assert {_partition_of(m) for m in msgs} == set(range(5))
