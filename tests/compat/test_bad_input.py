"""Malformed input over raw sockets: the broker rejects it (error frame or closed connection)
and keeps serving normal clients."""

import random
import struct
import time

import pulsar
import pytest

from compat_util import assert_nothing_more, check_round_trip, unique_topic
from pulsar_wire import (CHECKSUM_ERROR, MAX_FRAME, SEND_ERROR, SEND_RECEIPT, RawConnection,
                         base_command, cmd_connect, cmd_lookup, cmd_producer, cmd_send,
                         message_metadata, payload_frame, simple_frame)


def _now_ms():
    return int(time.time() * 1000)


def test_raw_handshake_and_send_work(server):
    """Control: the hand-built frames are right, so the rejections below are about the defect."""
    topic = unique_topic("raw-ok")
    client = server.client()
    try:
        consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
        with RawConnection(server.service_url) as conn:
            connected = conn.handshake()
            assert 1 in connected, "CONNECTED without server_version"
            name = conn.open_producer(topic)
            conn.send(payload_frame(cmd_send(1, 0), message_metadata(name, 0, _now_ms()),
                                    b"hand-made"))
            receipt = conn.expect(SEND_RECEIPT)
            assert receipt[1] == [1] and receipt[2] == [0]  # producer_id, sequence_id
        msg = consumer.receive(timeout_millis=10_000)
        assert msg.data() == b"hand-made"
    finally:
        client.close()


@pytest.mark.parametrize("garbage", [
    b"GET /admin/v2/brokers/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    struct.pack(">II", 20, 16) + b"\xff" * 16,                       # framed, not protobuf
    struct.pack(">II", 8, 100) + b"\x08\x02\x12\x00",                # command size > frame
    bytes(random.Random(42).getrandbits(8) for _ in range(4096)),
], ids=["http", "bad-protobuf", "bad-command-size", "random"])
def test_garbage_bytes(server, garbage):
    with RawConnection(server.service_url) as conn:
        conn.send(garbage)
        conn.error_or_close()
    check_round_trip(server)


def test_garbage_after_connect(server):
    with RawConnection(server.service_url) as conn:
        conn.handshake()
        conn.send(struct.pack(">II", 12, 8) + b"\xff\xfe\xfd\xfc\xfb\xfa\xf9\xf8")
        conn.error_or_close()
    check_round_trip(server)


def test_send_with_bad_checksum(server):
    topic = unique_topic("raw-crc")
    with RawConnection(server.service_url) as conn:
        conn.handshake()
        name = conn.open_producer(topic)
        conn.send(payload_frame(cmd_send(1, 0), message_metadata(name, 0, _now_ms()),
                                b"corrupted-payload", corrupt_checksum=True))
        kind, fields = conn.error_or_close()
        if kind == SEND_ERROR:  # CommandSendError: producer_id 1, sequence_id 2, error 3
            assert fields[1] == [1] and fields[2] == [0], fields
            assert fields[3] == [CHECKSUM_ERROR], "SEND_ERROR %r is not ChecksumError" % fields[3]
    check_round_trip(server)
    # the corrupt message was not stored
    client = server.client()
    try:
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        assert_nothing_more(reader, wait_ms=1500)
    finally:
        client.close()


def test_oversize_frame(server):
    with RawConnection(server.service_url) as conn:
        conn.handshake()
        header = struct.pack(">II", MAX_FRAME + 1, 16)
        if conn.send(header):
            conn.send(b"\0" * 65536)  # the start of the announced body; the rest never comes
        conn.error_or_close()
    check_round_trip(server)


def test_unknown_command_type(server):
    with RawConnection(server.service_url) as conn:
        conn.handshake()
        conn.send(simple_frame(base_command(99, 99, b"\x08\x01")))
        conn.error_or_close()
    check_round_trip(server)


@pytest.mark.parametrize("what", ["producer", "lookup", "send"])
def test_command_before_connect(server, what):
    topic = unique_topic("raw-early")
    with RawConnection(server.service_url) as conn:
        if what == "producer":
            conn.send(simple_frame(cmd_producer(topic, 1, 1)))
        elif what == "lookup":
            conn.send(simple_frame(cmd_lookup(topic, 1)))
        else:
            conn.send(payload_frame(cmd_send(1, 0), message_metadata("p", 0, _now_ms()), b"x"))
        conn.error_or_close()
    check_round_trip(server)


def test_connect_twice(server):
    with RawConnection(server.service_url) as conn:
        conn.handshake()
        conn.send(simple_frame(cmd_connect()))
        conn.error_or_close()
    check_round_trip(server)
