"""Readers: earliest, latest, from a message id (exclusive and inclusive)."""

import pulsar
import pytest

from compat_util import assert_nothing_more, payloads, read_n, unique_topic


def _produce(client, topic, n, start=0, batching=False):
    producer = client.create_producer(topic, batching_enabled=batching)
    if not batching:
        ids = [producer.send(("m-%d" % i).encode()) for i in range(start, start + n)]
    else:
        ids = [None] * n
        for k, i in enumerate(range(start, start + n)):
            def cb(res, msg_id, k=k):
                ids[k] = msg_id
            producer.send_async(("m-%d" % i).encode(), cb)
        producer.flush()
        assert all(i is not None for i in ids)
    producer.close()
    return ids


def test_reader_from_earliest(client):
    topic = unique_topic("rd-earliest")
    _produce(client, topic, 20)
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert payloads(read_n(reader, 20)) == ["m-%d" % i for i in range(20)]
    assert not reader.has_message_available()
    assert_nothing_more(reader)
    # a reader does not consume: a second one sees the same messages
    again = client.create_reader(topic, pulsar.MessageId.earliest)
    assert payloads(read_n(again, 20)) == ["m-%d" % i for i in range(20)]


def test_reader_from_latest_sees_only_new_messages(client):
    topic = unique_topic("rd-latest")
    _produce(client, topic, 5)
    reader = client.create_reader(topic, pulsar.MessageId.latest)
    assert_nothing_more(reader)
    _produce(client, topic, 3, start=5)
    assert payloads(read_n(reader, 3)) == ["m-5", "m-6", "m-7"]
    assert_nothing_more(reader)


@pytest.mark.parametrize("inclusive", [False, True], ids=["exclusive", "inclusive"])
def test_reader_from_message_id(client, inclusive):
    topic = unique_topic("rd-id")
    ids = _produce(client, topic, 10)
    reader = client.create_reader(topic, ids[4], start_message_id_inclusive=inclusive)
    first = 4 if inclusive else 5
    got = read_n(reader, 10 - first)
    assert payloads(got) == ["m-%d" % i for i in range(first, 10)]
    assert str(got[0].message_id()) == str(ids[first])
    assert_nothing_more(reader)


def test_reader_from_serialized_message_id(client):
    topic = unique_topic("rd-ser")
    ids = _produce(client, topic, 6)
    start = pulsar.MessageId.deserialize(ids[2].serialize())
    reader = client.create_reader(topic, start)
    assert payloads(read_n(reader, 3)) == ["m-3", "m-4", "m-5"]


@pytest.mark.parametrize("inclusive", [False, True], ids=["exclusive", "inclusive"])
def test_reader_from_id_inside_a_batch(client, inclusive):
    topic = unique_topic("rd-batch")
    ids = _produce(client, topic, 10, batching=True)
    assert ids[5].batch_index() >= 0, "expected batched messages"
    reader = client.create_reader(topic, ids[5], start_message_id_inclusive=inclusive)
    first = 5 if inclusive else 6
    assert payloads(read_n(reader, 10 - first)) == ["m-%d" % i for i in range(first, 10)]
    assert_nothing_more(reader)


def test_reader_on_empty_topic_from_earliest_gets_later_messages(client):
    topic = unique_topic("rd-empty")
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert not reader.has_message_available()
    _produce(client, topic, 2)
    assert payloads(read_n(reader, 2)) == ["m-0", "m-1"]


def test_reader_at_latest_inclusive_has_the_last_message_available(client):
    # Pulsar's python test_seek_latest_message_id: a reader at `latest` with an inclusive start
    # reads the last stored message, and says so through has_message_available (which compares
    # the subscription's mark-delete position with the last message id).
    topic = unique_topic("rd-latest-incl")
    _produce(client, topic, 3)
    reader = client.create_reader(topic, pulsar.MessageId.latest, start_message_id_inclusive=True)
    assert reader.has_message_available()
    got = []
    while reader.has_message_available():
        got.append(reader.read_next(timeout_millis=5000).data().decode())
    assert got == ["m-2"]
    assert_nothing_more(reader)
    # exclusive at latest: nothing yet
    other = client.create_reader(topic, pulsar.MessageId.latest)
    assert not other.has_message_available()
