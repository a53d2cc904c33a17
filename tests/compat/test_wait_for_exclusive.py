"""WaitForExclusive producers on raw frames (PIP-68).

Pulsar's ServerCnx.handleProducer queues a WaitForExclusive producer while another producer holds
the topic exclusively and answers at once PRODUCER_SUCCESS(request_id, producer_ready=false); once
the topic is free the producer takes it and a second PRODUCER_SUCCESS for the same request_id
says producer_ready=true. Only that producer waits: the connection goes on serving every other
command meanwhile. tests/go/producer_access_mode_test.go checks the same through the Go client."""

import socket

from compat_util import unique_topic
import pulsar_wire as wire
import raw_frames as raw


def _ready(fields):
    # CommandProducerSuccess: request_id 1, producer_name 2, ..., producer_ready 6 (default true)
    return bool(fields.get(6, [1])[0])


def test_wait_for_exclusive_waits_without_blocking_its_connection(server):
    topic = unique_topic("wfe-raw")
    other = unique_topic("wfe-raw-other")
    with wire.RawConnection(server.service_url) as a, wire.RawConnection(server.service_url) as b:
        a.handshake()
        raw.lookup(a, topic, 1)
        a.send(raw.producer_frame(topic, 1, 2, raw.ACCESS_EXCLUSIVE, "holder"))
        held = a.expect(wire.PRODUCER_SUCCESS)
        assert held[1] == [2] and _ready(held), held

        b.handshake()
        raw.lookup(b, topic, 1)
        b.send(raw.producer_frame(topic, 7, 2, raw.ACCESS_WAIT_FOR_EXCLUSIVE))
        try:
            queued = b.expect(wire.PRODUCER_SUCCESS, timeout=5)
        except socket.timeout:
            raise AssertionError("no PRODUCER_SUCCESS(producer_ready=false) within 5 s for a "
                                 "WaitForExclusive producer on a held topic")
        assert queued[1] == [2], queued
        assert not _ready(queued), "the queued producer was announced ready: %r" % queued

        # The connection keeps serving: PING, LOOKUP, another producer and its messages.
        b.send(raw.ping_frame())
        b.expect(wire.PONG, timeout=5)
        raw.lookup(b, other, 3)
        b.send(raw.producer_frame(other, 8, 4, raw.ACCESS_SHARED))
        other_name = b.expect(wire.PRODUCER_SUCCESS, timeout=5)[2][0].decode()
        for seq in range(3):
            receipt = raw.send_message(b, 8, other_name, seq, b"other-%d" % seq)
            assert receipt[1] == [8] and receipt[2] == [seq], receipt
        # ...and nothing more comes for the waiting producer while the holder is there.
        try:
            type_, fields = b.read_frame(timeout=0.7)
            raise AssertionError("unexpected %s %r while the holder is connected"
                                 % (raw.name(type_), fields))
        except socket.timeout:
            pass

        # The holder leaves: the waiting producer is ready, for the same request.
        a.send(raw.close_producer_frame(1, 3))
        assert a.expect(wire.SUCCESS)[1] == [3]
        try:
            ready = b.expect(wire.PRODUCER_SUCCESS, timeout=10)
        except socket.timeout:
            raise AssertionError("the waiting producer was not made ready within 10 s of the "
                                 "holder closing")
        assert ready[1] == [2] and _ready(ready), ready
        name = ready[2][0].decode()
        receipt = raw.send_message(b, 7, name, 0, b"from-the-waiter")
        assert receipt[1] == [7] and receipt[2] == [0], receipt

        # Now it holds the topic: an Exclusive producer is fenced off.
        a.send(raw.producer_frame(topic, 2, 4, raw.ACCESS_EXCLUSIVE))
        kind, fields = a.error_or_close(timeout=10)
        assert kind == wire.ERROR, (raw.name(kind) if kind != "closed" else kind, fields)
        assert fields[1] == [4] and fields[2] == [25], fields  # ServerError.ProducerFenced
