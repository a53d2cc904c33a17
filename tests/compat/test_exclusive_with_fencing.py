"""ExclusiveWithFencing producers (access mode 3) through the official Python client (the Go
client v0.19 has no such mode).

Pulsar's AbstractTopic.incrementTopicEpochIfNeeded: an ExclusiveWithFencing producer always takes
the topic. The producers attached are fenced (closed; an exclusive one that reconnects meets the
new holder, ProducerFenced, and fails its sends for good) and the WaitForExclusive producers in
line are answered ProducerFenced "Fenced out"."""

import threading
import time

import pulsar
import pytest

from compat_util import assert_nothing_more, payloads, receive_n, unique_topic

BOUND_S = 20


def test_exclusive_with_fencing_takes_the_topic_from_the_holder_and_the_waiters(server):
    topic = unique_topic("excl-fencing")
    # The consumer on a client of its own: Pulsar lets the fenced producer's next send close
    # its whole connection (and a consumer on it would be redelivered what it had).
    a, b, c, d = (pulsar.Client(server.service_url, operation_timeout_seconds=30)
                  for _ in range(4))
    try:
        holder = a.create_producer(topic, producer_name="holder", batching_enabled=False,
                                   access_mode=pulsar.ProducerAccessMode.Exclusive)
        consumer = d.subscribe(topic, "s")
        holder.send(b"from-holder")

        waited = {}

        def wait_for_the_topic():
            try:
                waited["producer"] = b.create_producer(
                    topic, access_mode=pulsar.ProducerAccessMode.WaitForExclusive)
            except Exception as e:  # noqa: BLE001 - the outcome is what the test checks
                waited["error"] = e
        waiter = threading.Thread(target=wait_for_the_topic, daemon=True)
        waiter.start()
        waiter.join(1.0)
        assert waiter.is_alive(), "the WaitForExclusive producer did not wait: %r" % waited

        # A second plain Exclusive producer is still refused while the holder is there.
        with pytest.raises(pulsar.ProducerFenced):
            c.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)

        fencer = c.create_producer(topic, batching_enabled=False,
                                   access_mode=pulsar.ProducerAccessMode.ExclusiveWithFencing)
        waiter.join(BOUND_S)
        assert not waiter.is_alive(), "the waiting producer was not answered within %d s" % BOUND_S
        assert isinstance(waited.get("error"), pulsar.ProducerFenced), waited
        fencer.send(b"from-fencer")

        # The old holder is fenced: its sends fail from now on.
        deadline = time.monotonic() + BOUND_S
        while True:
            try:
                holder.send(b"from-fenced")
            except pulsar.PulsarException:
                break
            assert time.monotonic() < deadline, "the fenced holder still sends"
        assert payloads(receive_n(consumer, 2)) == ["from-holder", "from-fencer"]
        assert_nothing_more(consumer)
        # A new exclusive producer is refused: the fencing producer holds the topic.
        with pytest.raises(pulsar.ProducerFenced):
            a.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
    finally:
        for client in (a, b, c, d):
            client.close()
