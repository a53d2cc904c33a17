"""Delayed delivery (deliver_after / deliver_at): held back on Shared and Key_Shared until due,
delivered at once on Exclusive, and kept across a broker restart."""

import time
from datetime import timedelta

import pulsar
import pytest

from compat_util import RECEIVE_TIMEOUT_MS, assert_nothing_more, unique_topic

DELAY_S = 2.0
LATE_BOUND_S = 3.0  # generous: due + this is still a pass on a loaded machine


def _receive(consumer, timeout_ms=RECEIVE_TIMEOUT_MS):
    msg = consumer.receive(timeout_millis=timeout_ms)
    consumer.acknowledge(msg)
    return msg, time.time()


@pytest.mark.parametrize("consumer_type", [pulsar.ConsumerType.Shared, pulsar.ConsumerType.KeyShared])
def test_deliver_after_waits_for_its_time(client, consumer_type):
    topic = unique_topic("delay")
    consumer = client.subscribe(topic, "sub", consumer_type=consumer_type)
    producer = client.create_producer(topic)
    sent_at = time.time()
    producer.send(b"late", deliver_after=timedelta(seconds=DELAY_S))
    producer.send(b"now")
    msg, _ = _receive(consumer)
    assert msg.data() == b"now", "the undelayed message must not wait behind the delayed one"
    msg, got_at = _receive(consumer, timeout_ms=int((DELAY_S + LATE_BOUND_S) * 1000))
    assert msg.data() == b"late"
    # deliver_at is taken by the client after sent_at, on the same clock (ms resolution)
    assert got_at >= sent_at + DELAY_S - 0.01, "arrived %.3f s early" % (sent_at + DELAY_S - got_at)
    assert got_at <= sent_at + DELAY_S + LATE_BOUND_S
    assert_nothing_more(consumer)


def test_deliver_at_orders_by_time_not_by_send_order(client):
    topic = unique_topic("delay-at")
    consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared)
    producer = client.create_producer(topic)
    now_ms = int(time.time() * 1000)
    producer.send(b"second", deliver_at=now_ms + 2000)
    producer.send(b"first", deliver_at=now_ms + 1000)
    first, first_at = _receive(consumer)
    second, second_at = _receive(consumer)
    assert (first.data(), second.data()) == (b"first", b"second")
    assert first_at * 1000 >= now_ms + 1000 - 10
    assert second_at * 1000 >= now_ms + 2000 - 10


def test_exclusive_delivers_delayed_messages_at_once(client):
    topic = unique_topic("delay-excl")
    consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Exclusive)
    producer = client.create_producer(topic)
    sent_at = time.time()
    producer.send(b"not-held", deliver_after=timedelta(seconds=30))
    msg, got_at = _receive(consumer, timeout_ms=5000)
    assert msg.data() == b"not-held"
    assert got_at - sent_at < 5


@pytest.mark.restarts_server
def test_delayed_messages_survive_a_restart(server):
    topic = unique_topic("delay-restart")
    c1 = server.client()
    consumer = c1.subscribe(topic, "durable", consumer_type=pulsar.ConsumerType.Shared)
    producer = c1.create_producer(topic)
    due_ms = int(time.time() * 1000) + 6000
    producer.send(b"delayed", deliver_at=due_ms)
    producer.send(b"plain")
    msg, _ = _receive(consumer)
    assert msg.data() == b"plain"
    c1.close()
    assert server.restart(graceful=True)
    c2 = server.client()
    try:
        consumer = c2.subscribe(topic, "durable", consumer_type=pulsar.ConsumerType.Shared)
        msg, got_at = _receive(consumer, timeout_ms=30_000)
        assert msg.data() == b"delayed"
        assert got_at * 1000 >= due_ms - 10, "delivered %.3f s early" % (due_ms / 1000 - got_at)
        assert_nothing_more(consumer)
    finally:
        c2.close()
