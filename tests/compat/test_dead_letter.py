"""Dead-letter topics and redelivery, as the clients implement them.

The broker's part: every redelivery (negative ack, ack timeout, a consumer leaving) raises the
message's `redelivery_count`; the client itself, once that count reaches `max_redeliver_count`,
publishes the message to the dead-letter topic (default `<topic>-<subscription>-DLQ`, created on
demand; `initial_subscription_name` makes the producer create that subscription) and
acknowledges the original. The Python client has no retry-letter-topic API, so retry is not
covered here.
"""

import time

import pulsar

from compat_util import assert_nothing_more, drain, payloads, receive_n, unique_topic


def _produce(client, topic, texts):
    producer = client.create_producer(topic, batching_enabled=False)
    for text in texts:
        producer.send(text.encode())
    producer.close()


def _consume_nacking(consumer, bad, expected_good, timeout_s=20):
    """Receives until every good message is acked and the bad one stops coming back; returns
    the redelivery counts seen for the bad message."""
    counts, good = [], set()
    deadline = time.time() + timeout_s
    quiet_since = None
    while time.time() < deadline:
        try:
            m = consumer.receive(timeout_millis=300)
        except pulsar.Timeout:
            if good == expected_good and counts:
                quiet_since = quiet_since or time.time()
                if time.time() - quiet_since > 1.5:
                    break
            continue
        quiet_since = None
        if m.data().decode() == bad:
            counts.append(m.redelivery_count())
            consumer.negative_acknowledge(m)
        else:
            good.add(m.data().decode())
            consumer.acknowledge(m)
    assert good == expected_good
    return counts


def test_negative_acks_end_in_the_dead_letter_topic(client):
    topic = unique_topic("dlq")
    dlq = topic + "-my-DLQ"
    dlq_consumer = client.subscribe(dlq, "dlq-sub",
                                    initial_position=pulsar.InitialPosition.Earliest)
    consumer = client.subscribe(
        topic, "sub", consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_redelivery_delay_ms=100,
        dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=2,
                                                           dead_letter_topic=dlq))
    _produce(client, topic, ["good-0", "bad", "good-1"])
    counts = _consume_nacking(consumer, "bad", {"good-0", "good-1"})
    # Delivered once, redelivered twice (counts 0, 1, 2), then dead-lettered.
    assert counts == [0, 1, 2]

    dead = receive_n(dlq_consumer, 1)
    assert payloads(dead) == ["bad"]
    dlq_consumer.acknowledge(dead[0])
    assert_nothing_more(dlq_consumer)

    # The original was acknowledged by the client: a new consumer of the subscription gets
    # nothing.
    consumer.close()
    again = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared)
    assert_nothing_more(again, wait_ms=1500)
    again.close()
    dlq_consumer.close()


def test_default_dead_letter_topic_name_and_initial_subscription(client):
    topic = unique_topic("dlq-default")
    consumer = client.subscribe(
        topic, "sub", consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_redelivery_delay_ms=100,
        dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(
            max_redeliver_count=1, initial_subscription_name="init-sub"))
    _produce(client, topic, ["ok", "bad"])
    assert _consume_nacking(consumer, "bad", {"ok"}) == [0, 1]
    consumer.close()

    # The dead-letter producer created "init-sub" on `<topic>-<subscription>-DLQ` before it
    # published, so a consumer of it sees the message even though it subscribes afterwards
    # (at the default "latest" position).
    dlq = client.subscribe(topic + "-sub-DLQ", "init-sub")
    assert payloads(receive_n(dlq, 1)) == ["bad"]
    dlq.close()


def test_ack_timeout_redelivers_with_a_higher_redelivery_count(client):
    topic = unique_topic("ack-timeout")
    # 10 s is the smallest ack timeout the C++-based client accepts.
    consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared,
                                unacked_messages_timeout_ms=10_000)
    _produce(client, topic, ["m-0", "m-1"])
    first = receive_n(consumer, 2)
    assert [m.redelivery_count() for m in first] == [0, 0]
    consumer.acknowledge(first[0])                # m-1 is left unacknowledged
    started = time.time()
    again = receive_n(consumer, 1, timeout_ms=25_000)
    assert time.time() - started >= 5
    assert payloads(again) == ["m-1"]
    assert again[0].redelivery_count() == 1
    consumer.acknowledge(again[0])
    assert drain(consumer, quiet_ms=1000) == []
    consumer.close()
