"""Subscription types: Exclusive, Failover, Shared."""

import queue

import pulsar
import pytest

from compat_util import RECEIVE_TIMEOUT_MS, assert_nothing_more, payloads, unique_topic


def test_exclusive_refuses_a_second_consumer(client, server):
    topic = unique_topic("excl")
    first = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Exclusive)
    other_client = server.client()
    try:
        with pytest.raises(pulsar.ConsumerBusy):
            other_client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Exclusive)
        # also refused on the same connection
        with pytest.raises(pulsar.ConsumerBusy):
            client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Exclusive)
        # another subscription on the same topic is fine, and so is the same one once freed
        client.subscribe(topic, "other-sub", consumer_type=pulsar.ConsumerType.Exclusive)
        first.close()
        second = other_client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Exclusive)
        producer = client.create_producer(topic)
        producer.send(b"to-the-second")
        assert second.receive(timeout_millis=RECEIVE_TIMEOUT_MS).data() == b"to-the-second"
    finally:
        other_client.close()


class _Collector:
    """Message listener that records (consumer name, payload) and acks."""

    def __init__(self):
        self.q = queue.Queue()

    def listener(self, name):
        def on_message(consumer, msg):
            consumer.acknowledge(msg)  # before anyone can see it: the test may close right after
            self.q.put((name, msg.data().decode()))
        return on_message

    def take(self, n, timeout_s=RECEIVE_TIMEOUT_MS / 1000):
        got = []
        for _ in range(n):
            try:
                got.append(self.q.get(timeout=timeout_s))
            except queue.Empty:
                raise AssertionError("only %d of %d messages arrived: %r" % (len(got), n, got[-5:]))
        return got

    def assert_quiet(self, wait_s=0.7):
        try:
            extra = self.q.get(timeout=wait_s)
        except queue.Empty:
            return
        raise AssertionError("unexpected extra delivery %r" % (extra,))


def test_failover_standby_takes_over_when_active_closes(client):
    topic = unique_topic("failover")
    col = _Collector()
    consumers = {}
    for name in ("fo-a", "fo-b"):
        consumers[name] = client.subscribe(
            topic, "sub", consumer_type=pulsar.ConsumerType.Failover, consumer_name=name,
            message_listener=col.listener(name), receiver_queue_size=10)
    producer = client.create_producer(topic)

    for i in range(20):
        producer.send(("m-%d" % i).encode())
    first = col.take(20)
    active = {name for name, _ in first}
    assert len(active) == 1, "failover delivered to both consumers: %r" % first
    assert [p for _, p in first] == ["m-%d" % i for i in range(20)]
    active = active.pop()
    standby = "fo-b" if active == "fo-a" else "fo-a"

    consumers[active].close()
    for i in range(20, 40):
        producer.send(("m-%d" % i).encode())
    second = col.take(20)
    assert {name for name, _ in second} == {standby}, second
    assert [p for _, p in second] == ["m-%d" % i for i in range(20, 40)]
    col.assert_quiet()


def test_shared_splits_messages_each_delivered_once(client):
    topic = unique_topic("shared")
    col = _Collector()
    consumers = [client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared,
                                  consumer_name=name, message_listener=col.listener(name),
                                  receiver_queue_size=10)
                 for name in ("sh-a", "sh-b")]
    producer = client.create_producer(topic, batching_enabled=False)
    n = 200
    for i in range(n):
        producer.send(("m-%d" % i).encode())
    got = col.take(n)
    bodies = [p for _, p in got]
    assert sorted(bodies) == sorted("m-%d" % i for i in range(n)), "lost or duplicated messages"
    per_consumer = {name: sum(1 for c, _ in got if c == name) for name in ("sh-a", "sh-b")}
    assert all(v > 0 for v in per_consumer.values()), "not split: %r" % per_consumer
    col.assert_quiet()
    for c in consumers:
        c.close()


def test_shared_consumer_close_hands_unacked_to_the_other(client):
    topic = unique_topic("shared-close")
    producer = client.create_producer(topic)
    a = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared,
                         initial_position=pulsar.InitialPosition.Earliest)
    b = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared,
                         initial_position=pulsar.InitialPosition.Earliest)
    for i in range(10):
        producer.send(("m-%d" % i).encode())
    got_a = []
    # a takes what it is given without acking, then goes away
    while True:
        try:
            got_a.append(a.receive(timeout_millis=1000))
        except pulsar.Timeout:
            break
    assert got_a, "the shared dispatcher gave nothing to the first consumer"
    a.close()
    rest = []
    while len(rest) < 10:
        try:
            m = b.receive(timeout_millis=RECEIVE_TIMEOUT_MS)
        except pulsar.Timeout:
            break
        rest.append(m)
        b.acknowledge(m)
    assert sorted(payloads(rest)) == sorted("m-%d" % i for i in range(10)), (
        "b must end up with every message, including the ones a left unacked")
    assert_nothing_more(b)
