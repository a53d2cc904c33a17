"""Produce and consume: batching, compression, keys, properties, event time, ordering."""

import threading

import pulsar
import pytest

from compat_util import assert_nothing_more, payloads, receive_n, unique_topic

EVENT_TIME_BASE = 1_700_000_000_000


def _send_all(producer, n, batching, body=lambda i: ("msg-%d" % i).encode(), **per_msg):
    """Sends n messages; with batching they go out asynchronously so that batches form.
    Returns the message ids in send order."""
    if not batching:
        return [producer.send(body(i), **{k: f(i) for k, f in per_msg.items()}) for i in range(n)]
    ids = [None] * n
    errors = []
    done = threading.Event()
    remaining = [n]
    lock = threading.Lock()

    def cb(i):
        def _cb(res, msg_id):
            with lock:
                if res != pulsar.Result.Ok:
                    errors.append((i, res))
                ids[i] = msg_id
                remaining[0] -= 1
                if remaining[0] == 0:
                    done.set()
        return _cb

    for i in range(n):
        producer.send_async(body(i), cb(i), **{k: f(i) for k, f in per_msg.items()})
    producer.flush()
    assert done.wait(30), "only %d of %d sends completed" % (n - remaining[0], n)
    assert not errors, errors[:5]
    return ids


@pytest.mark.parametrize("batching", [False, True], ids=["no-batching", "batching"])
def test_keys_properties_event_time_round_trip_in_order(client, batching):
    topic = unique_topic()
    n = 200
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=batching,
                                      batching_max_publish_delay_ms=20,
                                      batching_max_messages=50)
    _send_all(producer, n, batching,
              partition_key=lambda i: "key-%d" % (i % 7),
              properties=lambda i: {"i": str(i), "kind": "compat", "empty": ""},
              event_timestamp=lambda i: EVENT_TIME_BASE + i)
    msgs = receive_n(consumer, n)
    assert payloads(msgs) == ["msg-%d" % i for i in range(n)], "order or content changed"
    for i, m in enumerate(msgs):
        assert m.partition_key() == "key-%d" % (i % 7)
        assert m.properties() == {"i": str(i), "kind": "compat", "empty": ""}
        assert m.event_timestamp() == EVENT_TIME_BASE + i
        assert m.publish_timestamp() > 0
        assert m.topic_name() == topic
        consumer.acknowledge(m)
    if batching:
        # the producer did batch, so the broker stored and dispatched whole batches
        assert any(m.message_id().batch_index() > 0 for m in msgs), "no batch was formed"
    else:
        assert all(m.message_id().batch_index() == -1 for m in msgs)
    assert_nothing_more(consumer)


@pytest.mark.parametrize("batching", [False, True], ids=["no-batching", "batching"])
@pytest.mark.parametrize("compression", ["LZ4", "ZLib", "ZSTD", "SNAPPY"])
def test_compression_round_trip(client, compression, batching):
    topic = unique_topic("comp")
    n = 50
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=batching,
                                      batching_max_publish_delay_ms=20,
                                      compression_type=getattr(pulsar.CompressionType, compression))

    def body(i):  # compressible, distinct, and large enough to be compressed
        return (("%05d|" % i) + "the quick brown fox jumps over the lazy dog " * (20 + i % 5)).encode()

    _send_all(producer, n, batching, body=body, properties=lambda i: {"i": str(i)})
    msgs = receive_n(consumer, n)
    for i, m in enumerate(msgs):
        assert m.data() == body(i)
        assert m.properties() == {"i": str(i)}
        consumer.acknowledge(m)
    assert_nothing_more(consumer)


def test_ordering_many_messages_async(client):
    topic = unique_topic("order")
    n = 5000
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest,
                                receiver_queue_size=500)
    producer = client.create_producer(topic, batching_enabled=True,
                                      batching_max_publish_delay_ms=5,
                                      max_pending_messages=2000, block_if_queue_full=True)
    ids = _send_all(producer, n, True)
    msgs = receive_n(consumer, n)
    assert payloads(msgs) == ["msg-%d" % i for i in range(n)]
    # message ids grow with the send order
    got_ids = [(m.message_id().ledger_id(), m.message_id().entry_id(), m.message_id().batch_index())
               for m in msgs]
    assert got_ids == sorted(got_ids)
    assert [(i.ledger_id(), i.entry_id(), i.batch_index()) for i in ids] == got_ids
    consumer.acknowledge_cumulative(msgs[-1])
    assert_nothing_more(consumer)


def test_large_and_empty_messages(client):
    topic = unique_topic("sizes")
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic)
    big = bytes(range(256)) * 4096 * 4  # 4 MiB, under the 5 MiB default limit
    bodies = [b"", b"x", big, b"after-big"]
    for b in bodies:
        producer.send(b)
    msgs = receive_n(consumer, len(bodies))
    assert [m.data() for m in msgs] == bodies


def test_message_over_max_size_is_refused_by_the_client(client):
    """The broker announces max_message_size (5 MiB by default) in CONNECTED; the client enforces it."""
    topic = unique_topic("too-big")
    producer = client.create_producer(topic)
    with pytest.raises(pulsar.MessageTooBig):
        producer.send(b"\0" * (5 * 1024 * 1024 + 1))
    producer.send(b"small")  # the producer still works
