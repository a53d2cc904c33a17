"""GET_TOPICS_OF_NAMESPACE, as used by regex (pattern) subscriptions.

The client asks the broker for the namespace's topics, keeps those matching its pattern, and
asks again every `pattern_auto_discovery_period` seconds to pick up new topics.
"""

import re
import time
import uuid

import _pulsar
import pulsar

import pulsar_wire as wire
from compat_util import http_request, payloads, receive_n


def _send(client, topic, text):
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(text.encode())
    producer.close()


def _discovery_every_second(monkeypatch):
    """The Python wrapper (3.x) checks `pattern_auto_discovery_period` but never passes it on,
    leaving the C++ default of 60 s: set it on every consumer configuration it creates."""
    original = _pulsar.ConsumerConfiguration

    def configured():
        conf = original()
        conf.pattern_auto_discovery_period(1)
        return conf

    monkeypatch.setattr(_pulsar, "ConsumerConfiguration", configured)


def test_pattern_subscription_sees_existing_and_new_topics(client, monkeypatch):
    _discovery_every_second(monkeypatch)
    prefix = "pat-%s" % uuid.uuid4().hex
    base = "persistent://public/default/%s" % prefix
    existing = ["%s-%d" % (base, i) for i in range(3)]
    for topic in existing:
        _send(client, topic, "before " + topic)          # creates the topic
    _send(client, "persistent://public/default/other-%s" % prefix, "not matching")

    consumer = client.subscribe(re.compile(re.escape(base) + "-.*"), "sub",
                                initial_position=pulsar.InitialPosition.Earliest,
                                pattern_auto_discovery_period=1)
    got = receive_n(consumer, 3)
    assert sorted(payloads(got)) == sorted("before " + t for t in existing)
    for m in got:
        consumer.acknowledge(m)

    # A topic created after subscribing is discovered within a few discovery periods.
    late = "%s-late" % base
    deadline = time.time() + 20
    received = []
    _send(client, late, "late 0")
    i = 1
    while time.time() < deadline and not received:
        try:
            m = consumer.receive(timeout_millis=1000)
        except pulsar.Timeout:
            _send(client, late, "late %d" % i)   # in case the first one predates the discovery
            i += 1
            continue
        consumer.acknowledge(m)
        received.append(m)
    assert received, "no message from the topic created after subscribing"
    assert received[0].data().decode().startswith("late ")
    assert received[0].topic_name() == late
    consumer.close()


def test_pattern_subscription_includes_partitioned_topics(client, server):
    prefix = "patp-%s" % uuid.uuid4().hex
    base = "persistent://public/default/%s" % prefix
    partitioned = "%s-parted" % base
    status, body = http_request(
        "PUT", "%s/admin/v2/persistent/public/default/%s-parted/partitions" % (server.web_url,
                                                                              prefix), "2")
    assert status in (200, 204), body
    producer = client.create_producer(partitioned, batching_enabled=False,
                                      message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
    for i in range(4):
        producer.send(("p-%d" % i).encode())
    producer.close()

    consumer = client.subscribe(re.compile(re.escape(base) + "-.*"), "sub",
                                initial_position=pulsar.InitialPosition.Earliest)
    got = receive_n(consumer, 4)
    assert sorted(payloads(got)) == ["p-0", "p-1", "p-2", "p-3"]
    consumer.close()


# ---------------------------------------------------------------- the command itself, raw
GET_TOPICS_OF_NAMESPACE, GET_TOPICS_OF_NAMESPACE_RESPONSE = 32, 33


def _get_topics(conn, request_id, namespace, pattern=None, topics_hash=None, mode=None):
    # CommandGetTopicsOfNamespace: request_id = 1, namespace = 2, mode = 3, topics_pattern = 4,
    # topics_hash = 5
    body = wire.f_varint(1, request_id) + wire.f_bytes(2, namespace)
    if mode is not None:
        body += wire.f_varint(3, mode)
    if pattern is not None:
        body += wire.f_bytes(4, pattern)
    if topics_hash is not None:
        body += wire.f_bytes(5, topics_hash)
    conn.send(wire.simple_frame(wire.base_command(GET_TOPICS_OF_NAMESPACE,
                                                  GET_TOPICS_OF_NAMESPACE, body)))
    fields = conn.expect(GET_TOPICS_OF_NAMESPACE_RESPONSE)
    assert fields[1] == [request_id]
    return {
        "topics": [t.decode() for t in fields.get(2, [])],
        "filtered": bool(fields.get(3, [0])[0]),
        "hash": fields[4][0].decode() if 4 in fields else None,
        "changed": bool(fields.get(5, [1])[0]),
    }


def _pulsar_hash(topics):
    """TopicList.calculateHash: Guava crc32c of the sorted names joined by ',', whose
    HashCode.toString() is the hash's bytes, little-endian, in hex."""
    crc = wire.crc32c(",".join(sorted(topics)).encode())
    return crc.to_bytes(4, "little").hex()


def test_get_topics_of_namespace_filters_and_hashes(client, server):
    prefix = "gton-%s" % uuid.uuid4().hex
    base = "persistent://public/default/%s" % prefix
    plain = ["%s-%d" % (base, i) for i in range(2)]
    for topic in plain:
        _send(client, topic, "x")
    _send(client, "persistent://public/default/x%s" % prefix, "not matching")
    status, body = http_request(
        "PUT", "%s/admin/v2/persistent/public/default/%s-p/partitions" % (server.web_url, prefix),
        "2")
    assert status in (200, 204), body
    partitions = ["%s-p-partition-0" % base, "%s-p-partition-1" % base]
    expected = sorted(plain + partitions)

    with wire.RawConnection(server.service_url) as conn:
        conn.handshake()
        everything = _get_topics(conn, 1, "public/default")
        assert not everything["filtered"]
        assert set(expected) <= set(everything["topics"])
        assert everything["hash"] == _pulsar_hash(everything["topics"])

        got = _get_topics(conn, 2, "public/default", pattern=base + "-.*")
        assert got["filtered"] and got["changed"]
        assert sorted(got["topics"]) == expected
        assert got["hash"] == _pulsar_hash(expected)

        # The same hash back: unchanged, list left out.
        again = _get_topics(conn, 3, "public/default", pattern=base + "-.*",
                            topics_hash=got["hash"])
        assert again["topics"] == [] and not again["changed"]
        assert again["hash"] == got["hash"]

        # NON_PERSISTENT mode: none of these.
        np = _get_topics(conn, 4, "public/default", pattern=base + "-.*", mode=1)
        assert np["topics"] == []
