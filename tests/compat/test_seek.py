"""Seek: resetting a subscription (or a reader) to a message id or to a publish time.

Pulsar semantics (PersistentSubscription.resetCursor, ServerCnx.handleSeek): the broker
disconnects the subscription's consumers, resets the cursor (everything before the target is
acknowledged, everything from it on is not, whatever was acknowledged before), persists it and
answers the seek; the clients reconnect and receive from the target on. Seeking by time targets
the first message whose publish time is at or after the given time.
"""

import time

import pulsar
import pytest

from compat_util import assert_nothing_more, payloads, read_n, receive_n, unique_topic


def _produce(client, topic, n, start=0):
    producer = client.create_producer(topic, batching_enabled=False)
    ids = [producer.send(("m-%d" % i).encode()) for i in range(start, start + n)]
    producer.close()
    return ids


def _consume_and_ack(consumer, n):
    msgs = receive_n(consumer, n)
    for m in msgs:
        consumer.acknowledge(m)
    return msgs


@pytest.mark.parametrize("inclusive", [False, True], ids=["exclusive", "inclusive"])
def test_seek_by_message_id_redelivers_from_there(client, inclusive):
    # The broker resets the cursor to the given entry itself (as Pulsar does); the C++-based
    # Python client then drops that entry unless start_message_id_inclusive is set.
    topic = unique_topic("seek-id")
    consumer = client.subscribe(topic, "sub",
                                initial_position=pulsar.InitialPosition.Earliest,
                                start_message_id_inclusive=inclusive)
    ids = _produce(client, topic, 10)
    assert payloads(_consume_and_ack(consumer, 10)) == ["m-%d" % i for i in range(10)]
    assert_nothing_more(consumer)

    consumer.seek(ids[2])
    first = 2 if inclusive else 3
    got = receive_n(consumer, 10 - first)
    assert payloads(got) == ["m-%d" % i for i in range(first, 10)]
    assert str(got[0].message_id()) == str(ids[first])
    for m in got:
        consumer.acknowledge(m)
    assert_nothing_more(consumer)
    consumer.close()


def test_seek_is_persisted_and_forward_seek_skips(client):
    topic = unique_topic("seek-fwd")
    consumer = client.subscribe(topic, "sub",
                                initial_position=pulsar.InitialPosition.Earliest)
    ids = _produce(client, topic, 10)
    # Nothing acknowledged, then seek forward: the messages before the target count as acked.
    receive_n(consumer, 10)
    consumer.seek(ids[6])
    assert payloads(receive_n(consumer, 3)) == ["m-7", "m-8", "m-9"]
    consumer.close()
    # The reset cursor (at m-6 itself; the client dropped m-6) was persisted: a new consumer of
    # the subscription starts at m-6.
    again = client.subscribe(topic, "sub")
    assert payloads(receive_n(again, 4)) == ["m-6", "m-7", "m-8", "m-9"]
    assert_nothing_more(again)
    again.close()


def test_seek_to_earliest_and_latest(client):
    topic = unique_topic("seek-ends")
    consumer = client.subscribe(topic, "sub",
                                initial_position=pulsar.InitialPosition.Earliest)
    _produce(client, topic, 5)
    _consume_and_ack(consumer, 5)
    consumer.seek(pulsar.MessageId.earliest)
    assert payloads(_consume_and_ack(consumer, 5)) == ["m-%d" % i for i in range(5)]
    consumer.seek(pulsar.MessageId.latest)
    assert_nothing_more(consumer)
    _produce(client, topic, 2, start=5)
    assert payloads(receive_n(consumer, 2)) == ["m-5", "m-6"]
    consumer.close()


def test_seek_by_publish_time(client):
    topic = unique_topic("seek-time")
    consumer = client.subscribe(topic, "sub",
                                initial_position=pulsar.InitialPosition.Earliest)
    _produce(client, topic, 5)
    time.sleep(0.05)
    _produce(client, topic, 5, start=5)
    msgs = _consume_and_ack(consumer, 10)
    assert msgs[4].publish_timestamp() < msgs[5].publish_timestamp()
    t = msgs[5].publish_timestamp()

    consumer.seek(t)
    assert payloads(receive_n(consumer, 5)) == ["m-%d" % i for i in range(5, 10)]
    assert_nothing_more(consumer)

    # Before every message: everything again; after every message: nothing.
    consumer.seek(msgs[0].publish_timestamp() - 1000)
    assert payloads(_consume_and_ack(consumer, 10)) == ["m-%d" % i for i in range(10)]
    consumer.seek(int(time.time() * 1000) + 60_000)
    assert_nothing_more(consumer)
    consumer.close()


def test_seek_shared_subscription_with_two_consumers(client):
    topic = unique_topic("seek-shared")
    # Both consumers are disconnected by the seek; inclusive, so neither drops the target.
    c1 = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared,
                          initial_position=pulsar.InitialPosition.Earliest,
                          start_message_id_inclusive=True)
    c2 = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared,
                          start_message_id_inclusive=True)
    ids = _produce(client, topic, 10)
    seen = []
    deadline = time.time() + 10
    while len(seen) < 10 and time.time() < deadline:
        for c in (c1, c2):
            try:
                m = c.receive(timeout_millis=100)
            except pulsar.Timeout:
                continue
            c.acknowledge(m)
            seen.append(m.data().decode())
    assert sorted(seen) == sorted("m-%d" % i for i in range(10))

    c1.seek(ids[4])
    again = []
    deadline = time.time() + 15
    while len(again) < 6 and time.time() < deadline:
        for c in (c1, c2):
            try:
                m = c.receive(timeout_millis=100)
            except pulsar.Timeout:
                continue
            c.acknowledge(m)
            again.append(m.data().decode())
    assert sorted(again) == ["m-%d" % i for i in range(4, 10)]
    c1.close()
    c2.close()


def test_reader_seek_by_message_id_and_time(client):
    topic = unique_topic("seek-reader")
    ids = _produce(client, topic, 10)
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    msgs = read_n(reader, 10)
    assert payloads(msgs) == ["m-%d" % i for i in range(10)]

    reader.seek(ids[2])  # exclusive, as the reader was created with
    assert payloads(read_n(reader, 7)) == ["m-%d" % i for i in range(3, 10)]
    assert_nothing_more(reader)

    # Several messages may share a millisecond: expect all published at or after t.
    t = msgs[6].publish_timestamp()
    expected = [m.data().decode() for m in msgs if m.publish_timestamp() >= t]
    reader.seek(t)
    assert payloads(read_n(reader, len(expected))) == expected
    assert_nothing_more(reader)
    reader.close()


def test_seek_errors_raw(server):
    """ServerCnx.handleSeek: METADATA_ERROR without a target or for an unknown consumer."""
    import pulsar_wire as wire
    SEEK, METADATA_ERROR = 28, 1
    with wire.RawConnection(server.service_url) as conn:
        conn.handshake()
        # CommandSeek: consumer_id = 1, request_id = 2, message_id = 3, message_publish_time = 4
        conn.send(wire.simple_frame(wire.base_command(
            SEEK, SEEK, wire.f_varint(1, 77) + wire.f_varint(2, 5))))
        fields = conn.expect(wire.ERROR)
        assert fields[1] == [5] and fields[2] == [METADATA_ERROR]
        conn.send(wire.simple_frame(wire.base_command(
            SEEK, SEEK, wire.f_varint(1, 77) + wire.f_varint(2, 6) + wire.f_varint(4, 1000))))
        fields = conn.expect(wire.ERROR)
        assert fields[1] == [6] and fields[2] == [METADATA_ERROR]
        # The connection is still usable.
        conn.send(wire.simple_frame(wire.base_command(wire.PING, 18, b"")))
        conn.expect(wire.PONG)


def test_seek_by_time_on_a_partitioned_topic(client, server):
    """A consumer of a partitioned topic seeks every partition to the publish time."""
    from compat_util import http_request, short_name
    topic = unique_topic("seek-parted")
    status, body = http_request("PUT", "%s/admin/v2/persistent/public/default/%s/partitions"
                                % (server.web_url, short_name(topic)), "3")
    assert status in (200, 204), body
    consumer = client.subscribe(topic, "sub",
                                initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(
        topic, batching_enabled=False,
        message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
    for i in range(6):
        producer.send(("m-%d" % i).encode())
    time.sleep(0.05)
    for i in range(6, 12):
        producer.send(("m-%d" % i).encode())
    producer.close()
    msgs = _consume_and_ack(consumer, 12)
    by_payload = {m.data().decode(): m for m in msgs}
    t = by_payload["m-6"].publish_timestamp()
    assert by_payload["m-5"].publish_timestamp() < t

    consumer.seek(t)
    got = receive_n(consumer, 6)
    assert sorted(payloads(got)) == sorted("m-%d" % i for i in range(6, 12))
    assert_nothing_more(consumer)
    consumer.close()
