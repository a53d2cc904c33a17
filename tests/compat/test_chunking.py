"""Chunked messages (PIP-37) through the official Python client and a raw-socket producer.

A chunking producer splits a message larger than the broker's max message size (5 MiB, sent in
CONNECTED) into chunk entries of at most that size, all with the message's uuid; the broker stores
and dispatches them like any entry and the consumer reassembles them. Incomplete chunked messages
(a producer that died midway) are held by the consumer (`max_pending_chunked_message`), and when
the oldest is evicted it is acked (`auto_ack_oldest_chunked_message_on_queue_full=True`) or left
unacked for redelivery (the default), as the C++ client does."""

import os
import uuid

import pulsar
import pytest

import pulsar_wire as pw
from compat_util import assert_nothing_more, receive_n

MIB = 1024 * 1024


def _consumer(client, topic, sub="s", **kwargs):
    return client.subscribe(topic, sub, consumer_type=pulsar.ConsumerType.Exclusive,
                            initial_position=pulsar.InitialPosition.Earliest, **kwargs)


def _chunking_producer(client, topic):
    return client.create_producer(topic, chunking_enabled=True, batching_enabled=False,
                                  send_timeout_millis=60_000)


def test_20mib_message_arrives_whole_and_ack_acks_every_chunk(server, client, topic):
    big = os.urandom(20 * MIB)
    consumer = _consumer(client, topic)
    producer = _chunking_producer(client, topic)
    producer.send(big)
    producer.send(b"after")

    msg, after = receive_n(consumer, 2, timeout_ms=60_000)
    assert len(msg.data()) == len(big) and msg.data() == big
    assert after.data() == b"after"
    # Each chunk is at most the 5 MiB max message size, metadata included, so 20 MiB takes at
    # least 5 entries: on a new topic the message id (that of the last chunk) is entry >= 4, and
    # the next message follows it directly.
    assert msg.message_id().entry_id() >= 4, msg.message_id()
    assert after.message_id().entry_id() == msg.message_id().entry_id() + 1

    consumer.acknowledge(msg)
    consumer.acknowledge(after)
    consumer.close()  # flushes the grouped acks

    # Every chunk entry was acked: the broker's first delivery to a new consumer on the
    # subscription is a message published afterwards, not a chunk (a raw consumer sees the
    # entries themselves; the client would hide an incomplete chunked message).
    marker_id = producer.send(b"marker")
    with pw.RawConnection(server.service_url) as conn:
        conn.handshake()
        conn.subscribe(topic, "s")
        first = conn.next_message_id(timeout=10)
    assert first == (marker_id.ledger_id(), marker_id.entry_id()), (first, marker_id)

    # A reader still gets the whole message once, then the next one.
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert reader.read_next(timeout_millis=60_000).data() == big
    assert reader.read_next(timeout_millis=10_000).data() == b"after"
    assert reader.read_next(timeout_millis=10_000).data() == b"marker"
    reader.close()


def test_chunked_messages_in_order_with_plain_ones(client, topic):
    consumer = _consumer(client, topic)
    producer = _chunking_producer(client, topic)
    sent = [os.urandom(6 * MIB), b"small-1", os.urandom(11 * MIB), b"small-2"]
    for payload in sent:
        producer.send(payload)
    got = receive_n(consumer, len(sent), timeout_ms=60_000)
    assert [m.data() for m in got] == sent
    for m in got:
        consumer.acknowledge(m)
    assert_nothing_more(consumer)


def _dead_producer_chunks(server, topic, chunk_uuid, total_chunks, sent_chunks, chunk_size):
    """A raw producer sends the first `sent_chunks` of a chunked message and disconnects."""
    with pw.RawConnection(server.service_url) as conn:
        conn.handshake()
        name = conn.open_producer(topic)
        for chunk_id in range(sent_chunks):
            conn.send_chunk(1, name, 0, chunk_uuid, total_chunks, total_chunks * chunk_size,
                            chunk_id, bytes([chunk_id]) * chunk_size)


@pytest.mark.parametrize("auto_ack", [False, True], ids=["left-unacked", "auto-acked"])
def test_incomplete_chunked_message_from_dead_producer(server, client, topic, auto_ack):
    """Chunks 0 and 1 of 3 from a producer that died, then complete messages. The consumer (at
    most one pending chunked message) drops the incomplete one when the next chunked message
    starts, and the later messages arrive. Then a new consumer on the subscription and the
    missing last chunk: if the dropped chunks were auto-acked the broker does not redeliver them
    and the lone last chunk is discarded too; otherwise they are redelivered and, with the last
    chunk, make the whole message."""
    chunk_uuid = "dead-%s" % uuid.uuid4().hex
    chunk_size = 1000
    _dead_producer_chunks(server, topic, chunk_uuid, 3, 2, chunk_size)

    consumer = _consumer(client, topic, max_pending_chunked_message=1,
                         auto_ack_oldest_chunked_message_on_queue_full=auto_ack)
    producer = _chunking_producer(client, topic)
    whole = os.urandom(6 * MIB)  # two chunks
    producer.send(whole)
    producer.send(b"plain")
    got = receive_n(consumer, 2, timeout_ms=60_000)
    assert got[0].data() == whole
    assert got[1].data() == b"plain"
    for m in got:
        consumer.acknowledge(m)
    assert_nothing_more(consumer)
    consumer.close()

    consumer = _consumer(client, topic)
    # the last chunk of the dead producer's message, sent late by another raw producer
    with pw.RawConnection(server.service_url) as conn:
        conn.handshake()
        name = conn.open_producer(topic)
        conn.send_chunk(1, name, 0, chunk_uuid, 3, 3 * chunk_size, 2, bytes([2]) * chunk_size)
    if auto_ack:
        assert_nothing_more(consumer, wait_ms=2000)
    else:
        msg = consumer.receive(timeout_millis=10_000)
        assert msg.data() == b"".join(bytes([i]) * chunk_size for i in range(3))
        consumer.acknowledge(msg)
        assert_nothing_more(consumer)
    consumer.close()


def test_incomplete_chunks_do_not_block_later_messages(server, client, topic):
    """With the default pending limit the incomplete message stays pending in the consumer, and
    complete chunked and plain messages after it still arrive, in order."""
    _dead_producer_chunks(server, topic, "dead-%s" % uuid.uuid4().hex, 4, 3, 5000)
    consumer = _consumer(client, topic)
    producer = _chunking_producer(client, topic)
    sent = [b"first", os.urandom(7 * MIB), b"last"]
    for payload in sent:
        producer.send(payload)
    got = receive_n(consumer, len(sent), timeout_ms=60_000)
    assert [m.data() for m in got] == sent
    for m in got:
        consumer.acknowledge(m)
    assert_nothing_more(consumer)
