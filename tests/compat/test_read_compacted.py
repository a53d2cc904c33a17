"""readCompacted consumers and readers on topics that were never compacted (compacted topics:
test_compaction.py). As on Pulsar, a compacted read of a topic without a compaction horizon reads the topic itself, so TableView works
(the Python client's test_null_value_table_view); readCompacted is refused on Shared and
Key_Shared subscriptions and on non-persistent topics with Pulsar's NotAllowed reasons."""

import pulsar
import pytest

import pulsar_wire as wire
import raw_frames as raw
from compat_util import eventually, payloads, receive_n, short_name, unique_topic

NOT_ALLOWED_ERROR = 22  # ServerError


def _subscribe_read_compacted(server, topic, sub_type):
    with wire.RawConnection(server.service_url) as conn:
        conn.handshake()
        raw.lookup(conn, topic, 1)
        conn.send(raw.frame(wire.SUBSCRIBE, _with_read_compacted(topic, sub_type)))
        return conn.read_frame(timeout=5)


def _with_read_compacted(topic, sub_type):
    # raw.subscribe_frame's fields, with CommandSubscribe.read_compacted (11) set.
    return (wire.f_bytes(1, topic) + wire.f_bytes(2, "s") + wire.f_varint(3, sub_type)
            + wire.f_varint(4, 1) + wire.f_varint(5, 2) + wire.f_bytes(6, "c")
            + wire.f_varint(11, 1) + wire.f_varint(13, 1))


def test_read_compacted_is_refused_where_pulsar_refuses_it(server):
    topic = unique_topic("read-compacted")
    type_, fields = _subscribe_read_compacted(server, topic, raw.SHARED)
    assert type_ == wire.ERROR and fields[2] == [NOT_ALLOWED_ERROR], (type_, fields)
    assert fields[3] == [b"readCompacted only allowed on failover or exclusive subscriptions"]
    volatile = "non-persistent://public/default/" + short_name(unique_topic("read-compacted-np"))
    type_, fields = _subscribe_read_compacted(server, volatile, raw.EXCLUSIVE)
    assert type_ == wire.ERROR and fields[3] == [b"readCompacted only valid on persistent topics"]
    type_, fields = _subscribe_read_compacted(server, topic, raw.EXCLUSIVE)
    assert type_ == wire.SUCCESS, (type_, fields)


def test_read_compacted_reads_a_never_compacted_topic_whole_and_table_view_works(client, server):
    topic = unique_topic("table-view")
    producer = client.create_producer(topic, batching_enabled=False)
    for key, value in (("a", b"1"), ("b", b"2"), ("a", b"3")):
        producer.send(value, partition_key=key)
    consumer = client.subscribe(topic, "compacted", is_read_compacted=True,
                                initial_position=pulsar.InitialPosition.Earliest)
    assert payloads(receive_n(consumer, 3)) == ["1", "2", "3"]
    table = client.create_table_view(topic)
    try:
        # The view fills from its reader: no event to wait on.
        eventually("the view holds a=3, b=2",
                   lambda: table.get("a") == b"3" and table.get("b") == b"2", deadline_s=10)
        producer.send(b"", partition_key="b")  # a null value removes the key
        eventually("b removed", lambda: table.get("b") is None and len(table) == 1, deadline_s=10)
    finally:
        table.close()
