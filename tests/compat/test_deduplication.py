"""Producer deduplication (Pulsar's MessageDeduplication): per producer name, a SEND whose
sequence id is not above the last stored one is acknowledged but not stored; PRODUCER_SUCCESS
tells a reconnecting producer its last stored sequence id; the state survives a restart."""

import threading
import time
import uuid

import pulsar
import pytest

from compat_util import (RECEIVE_TIMEOUT_MS, assert_nothing_more, http_request, receive_n,
                         short_name, unique_topic)

POLICY_TIMEOUT_S = 30


def _dedup_namespace(server):
    """A fresh namespace with deduplication enabled; returns its name (tenant/ns)."""
    ns = "public/dedup-%s" % uuid.uuid4().hex[:12]
    status, body = http_request("PUT", "%s/admin/v2/namespaces/%s" % (server.web_url, ns))
    assert status in (200, 204), body
    status, body = http_request("POST", "%s/admin/v2/namespaces/%s/deduplication"
                                % (server.web_url, ns), "true")
    assert status in (200, 204), body
    status, body = http_request("GET", "%s/admin/v2/namespaces/%s/deduplication"
                                % (server.web_url, ns))
    assert (status, body.strip()) == (200, b"true")
    return ns


def _producer(client, topic, name, **kwargs):
    return client.create_producer(topic, producer_name=name, batching_enabled=False,
                                  send_timeout_millis=10_000, **kwargs)


def _consumer(client, topic, sub="s"):
    return client.subscribe(topic, sub, consumer_type=pulsar.ConsumerType.Exclusive,
                            initial_position=pulsar.InitialPosition.Earliest)


def _is_dup_receipt(message_id):
    # Pulsar acknowledges a duplicate at once with message id -1:-1.
    return message_id.ledger_id() == -1 and message_id.entry_id() == -1


def _wait_dedup_effective(client, topic, producer_name="dedup-probe"):
    """Deduplication policies reach a loaded topic asynchronously in Pulsar: probe until a
    resent sequence id is acknowledged as a duplicate (bounded)."""
    probe = _producer(client, topic, producer_name)
    deadline = time.monotonic() + POLICY_TIMEOUT_S
    seq = 1_000_000
    while True:
        probe.send(b"probe", sequence_id=seq)
        if _is_dup_receipt(probe.send(b"probe", sequence_id=seq)):
            break
        assert time.monotonic() < deadline, "deduplication never took effect on %s" % topic
        seq += 1
        time.sleep(0.2)
    probe.close()


def _data(messages):
    return [m.data().decode() for m in messages]


def test_resend_after_reconnect_is_not_stored(server, client):
    # Sequence ids start at 10: the Python client treats sequence_id=0 as "not given".
    ns = _dedup_namespace(server)
    topic = "persistent://%s/resend" % ns
    consumer = _consumer(client, topic)
    producer = _producer(client, topic, "p1")
    assert producer.last_sequence_id() == -1
    for seq in range(10, 15):
        message_id = producer.send(("m%d" % seq).encode(), sequence_id=seq)
        assert not _is_dup_receipt(message_id)
    producer.close()

    # The same producer name again: the broker tells it where it stopped.
    producer = _producer(client, topic, "p1")
    assert producer.last_sequence_id() == 14
    for seq in range(10, 15):  # a client resending what it was not sure about
        assert _is_dup_receipt(producer.send(("again%d" % seq).encode(), sequence_id=seq))
    for seq in range(15, 18):
        assert not _is_dup_receipt(producer.send(("m%d" % seq).encode(), sequence_id=seq))
    assert producer.last_sequence_id() == 17

    got = receive_n(consumer, 8)
    assert _data(got) == ["m%d" % i for i in range(10, 18)]
    assert_nothing_more(consumer)

    # Another producer name has its own sequence.
    other = _producer(client, topic, "p2")
    assert other.last_sequence_id() == -1
    assert not _is_dup_receipt(other.send(b"p2-1", sequence_id=1))
    assert receive_n(consumer, 1)[0].data() == b"p2-1"


def test_disabled_stores_duplicates(client):
    topic = unique_topic("dedup-off")  # public/default: deduplication off by default
    consumer = _consumer(client, topic)
    producer = _producer(client, topic, "p")
    for seq in range(1, 4):
        producer.send(("a%d" % seq).encode(), sequence_id=seq)
    producer.close()
    producer = _producer(client, topic, "p")
    assert producer.last_sequence_id() == -1
    for seq in range(1, 4):
        assert not _is_dup_receipt(producer.send(("b%d" % seq).encode(), sequence_id=seq))
    got = receive_n(consumer, 6)
    assert _data(got) == ["a1", "a2", "a3", "b1", "b2", "b3"]


def test_topic_level_policy(server, client):
    topic = unique_topic("dedup-topic")
    url = "%s/admin/v2/persistent/public/default/%s/deduplicationEnabled" % (
        server.web_url, short_name(topic))
    consumer = _consumer(client, topic)
    producer = _producer(client, topic, "p")
    producer.send(b"before", sequence_id=1)
    producer.send(b"before-dup", sequence_id=1)  # stored: deduplication is off
    status, body = http_request("POST", url, "true")
    assert status in (200, 204), body
    status, body = http_request("GET", url)
    assert (status, body.strip()) == (200, b"true")
    _wait_dedup_effective(client, topic)

    producer.close()
    producer = _producer(client, topic, "p")
    assert producer.last_sequence_id() >= 0
    last = producer.last_sequence_id()
    assert _is_dup_receipt(producer.send(b"dup", sequence_id=last))
    assert not _is_dup_receipt(producer.send(b"after", sequence_id=last + 1))
    got = []
    while len(got) < 3:  # each receive bounded; probe messages are not counted
        m = consumer.receive(timeout_millis=RECEIVE_TIMEOUT_MS)
        if m.data() != b"probe":
            got.append(m)
    assert _data(got) == ["before", "before-dup", "after"]

    status, body = http_request("POST", url, "false")
    assert status in (200, 204), body


@pytest.mark.restarts_server
def test_state_survives_kill9_restart(server):
    ns = _dedup_namespace(server)
    topic = "persistent://%s/restart" % ns
    # More than one snapshot interval (1,000 entries in Pulsar): both the snapshot and the
    # replay of the entries after it are needed after the restart.
    total = 1_500
    c1 = server.client()
    try:
        producer = _producer(c1, topic, "survivor", max_pending_messages=500,
                             block_if_queue_full=True)
        done = threading.Semaphore(0)
        failures = []

        def sent(result, _message_id):
            if result != pulsar.Result.Ok:
                failures.append(result)
            done.release()

        for seq in range(1, total + 1):
            producer.send_async(("m%d" % seq).encode(), sent, sequence_id=seq)
        for _ in range(total):
            assert done.acquire(timeout=60), "send not acknowledged within 60 s"
        assert failures == []
    finally:
        c1.close()

    server.restart(graceful=False)

    c2 = server.client()
    try:
        producer = _producer(c2, topic, "survivor")
        assert producer.last_sequence_id() == total
        for seq in range(total - 4, total + 1):
            assert _is_dup_receipt(producer.send(b"dup", sequence_id=seq))
        producer.send(b"tail", sequence_id=total + 1)
        consumer = _consumer(c2, topic)
        got = receive_n(consumer, total + 1)
        assert _data(got) == ["m%d" % i for i in range(1, total + 1)] + ["tail"]
        assert_nothing_more(consumer)
    finally:
        c2.close()
