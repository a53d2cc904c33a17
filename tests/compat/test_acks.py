"""Acknowledgements and redelivery."""

import pulsar
import pytest

from compat_util import (RECEIVE_TIMEOUT_MS, assert_nothing_more, payloads, receive_n,
                         unique_topic)


def _produce(client, topic, n, prefix="m"):
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(n):
        producer.send(("%s-%d" % (prefix, i)).encode())
    producer.close()


@pytest.mark.parametrize("sub_type", ["Exclusive", "Shared"])
def test_individual_ack_survives_reconnect(server, sub_type):
    topic = unique_topic("ack-ind")
    ctype = getattr(pulsar.ConsumerType, sub_type)
    c1 = server.client()
    consumer = c1.subscribe(topic, "sub", consumer_type=ctype,
                            initial_position=pulsar.InitialPosition.Earliest)
    _produce(c1, topic, 10)
    msgs = receive_n(consumer, 10)
    assert payloads(msgs) == ["m-%d" % i for i in range(10)]
    for m in msgs[::2]:  # ack the even ones only
        consumer.acknowledge(m)
    consumer.close()
    c1.close()

    c2 = server.client()
    try:
        consumer = c2.subscribe(topic, "sub", consumer_type=ctype)
        again = receive_n(consumer, 5)
        assert sorted(payloads(again), key=lambda s: int(s.split("-")[1])) == \
            ["m-%d" % i for i in range(1, 10, 2)], "acked ones redelivered or unacked ones lost"
        for m in again:
            consumer.acknowledge(m)
        assert_nothing_more(consumer)
    finally:
        c2.close()


def test_cumulative_ack_survives_reconnect(server):
    topic = unique_topic("ack-cum")
    c1 = server.client()
    consumer = c1.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Exclusive,
                            initial_position=pulsar.InitialPosition.Earliest)
    _produce(c1, topic, 10)
    msgs = receive_n(consumer, 10)
    consumer.acknowledge_cumulative(msgs[5])  # m-0 .. m-5
    consumer.close()
    c1.close()

    c2 = server.client()
    try:
        consumer = c2.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Exclusive)
        again = receive_n(consumer, 4)
        assert payloads(again) == ["m-%d" % i for i in range(6, 10)]
        consumer.acknowledge_cumulative(again[-1])
        assert_nothing_more(consumer)
    finally:
        c2.close()


def test_cumulative_ack_refused_on_shared(client):
    topic = unique_topic("ack-cum-shared")
    consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared,
                                initial_position=pulsar.InitialPosition.Earliest)
    _produce(client, topic, 1)
    m = consumer.receive(timeout_millis=RECEIVE_TIMEOUT_MS)
    with pytest.raises(pulsar.CumulativeAcknowledgementNotAllowedError):
        consumer.acknowledge_cumulative(m)


def test_unacked_redelivered_to_next_consumer(server):
    """Unacked messages go to the next consumer of the subscription after the first one closes.

    Apache Pulsar 4.0 does not raise redelivery_count in this case (only redeliver/nack/ack
    timeout do, see the tests below), so the count is not asserted here."""
    topic = unique_topic("unacked")
    c1 = server.client()
    consumer = c1.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared,
                            initial_position=pulsar.InitialPosition.Earliest)
    _produce(c1, topic, 5)
    first = receive_n(consumer, 5)
    assert all(m.redelivery_count() == 0 for m in first)
    consumer.close()  # no ack
    c1.close()

    c2 = server.client()
    try:
        consumer = c2.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared)
        again = receive_n(consumer, 5)
        assert sorted(payloads(again)) == sorted(payloads(first))
        for m in again:
            consumer.acknowledge(m)
        assert_nothing_more(consumer)
    finally:
        c2.close()


def test_redeliver_unacknowledged_increments_redelivery_count(client):
    topic = unique_topic("redeliver")
    consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared,
                                initial_position=pulsar.InitialPosition.Earliest)
    _produce(client, topic, 3)
    first = receive_n(consumer, 3)
    assert [m.redelivery_count() for m in first] == [0, 0, 0]
    consumer.redeliver_unacknowledged_messages()
    again = receive_n(consumer, 3)
    assert sorted(payloads(again)) == sorted(payloads(first))
    assert all(m.redelivery_count() == 1 for m in again), [m.redelivery_count() for m in again]
    for m in again:
        consumer.acknowledge(m)
    assert_nothing_more(consumer)


@pytest.mark.parametrize("sub_type", ["Shared", "Exclusive"])
def test_negative_ack_redelivers(client, sub_type):
    topic = unique_topic("nack")
    consumer = client.subscribe(topic, "sub", consumer_type=getattr(pulsar.ConsumerType, sub_type),
                                initial_position=pulsar.InitialPosition.Earliest,
                                negative_ack_redelivery_delay_ms=100)
    _produce(client, topic, 4)
    first = receive_n(consumer, 4)
    consumer.acknowledge(first[0])
    consumer.acknowledge(first[2])
    consumer.negative_acknowledge(first[1])
    consumer.negative_acknowledge(first[3])
    again = receive_n(consumer, 2)
    assert sorted(payloads(again)) == ["m-1", "m-3"]
    if sub_type == "Shared":  # the broker tracks redelivery counts for shared subscriptions
        assert all(m.redelivery_count() >= 1 for m in again), [m.redelivery_count() for m in again]
    # nack it once more: it comes back again
    consumer.acknowledge(again[0])
    consumer.negative_acknowledge(again[1])
    third = receive_n(consumer, 1)
    assert payloads(third) == [again[1].data().decode()]
    if sub_type == "Shared":
        assert third[0].redelivery_count() > again[1].redelivery_count()
    consumer.acknowledge(third[0])
    assert_nothing_more(consumer)
