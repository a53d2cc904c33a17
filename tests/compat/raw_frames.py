"""Raw-frame helpers on top of pulsar_wire for the protocol-ordering tests (no fixtures here):
typed SUBSCRIBE and PRODUCER commands, and reading several raw connections at once with the
arrival time of every frame."""

import socket
import time

import pulsar_wire as wire

# BaseCommand.Type values (the nested command's field number is the same number)
ACK = 10
CLOSE_PRODUCER, CLOSE_CONSUMER = 15, 16
ACTIVE_CONSUMER_CHANGE = 31
GET_SCHEMA, GET_SCHEMA_RESPONSE = 34, 35
NEW_TXN, ADD_PARTITION_TO_TXN, ADD_SUBSCRIPTION_TO_TXN, END_TXN = 50, 52, 54, 56
TC_CLIENT_CONNECT_REQUEST = 62

NAMES = dict(wire.TYPE_NAMES)
NAMES.update({10: "ACK", 15: "CLOSE_PRODUCER", 16: "CLOSE_CONSUMER", 31: "ACTIVE_CONSUMER_CHANGE",
              34: "GET_SCHEMA", 35: "GET_SCHEMA_RESPONSE", 50: "NEW_TXN", 51: "NEW_TXN_RESPONSE",
              52: "ADD_PARTITION_TO_TXN", 53: "ADD_PARTITION_TO_TXN_RESPONSE",
              54: "ADD_SUBSCRIPTION_TO_TXN", 55: "ADD_SUBSCRIPTION_TO_TXN_RESPONSE",
              56: "END_TXN", 57: "END_TXN_RESPONSE", 62: "TC_CLIENT_CONNECT_REQUEST",
              63: "TC_CLIENT_CONNECT_RESPONSE"})

# CommandSubscribe.SubType
EXCLUSIVE, SHARED, FAILOVER, KEY_SHARED = 0, 1, 2, 3
# ProducerAccessMode
ACCESS_SHARED, ACCESS_EXCLUSIVE, ACCESS_WAIT_FOR_EXCLUSIVE = 0, 1, 2
# ServerError
UNKNOWN_ERROR, TOPIC_NOT_FOUND, NOT_ALLOWED_ERROR = 0, 11, 22


def name(type_):
    return NAMES.get(type_, str(type_))


def frame(type_, body):
    return wire.simple_frame(wire.base_command(type_, type_, body))


def subscribe_frame(topic, subscription, consumer_id, request_id, sub_type, consumer_name):
    # CommandSubscribe: topic 1, subscription 2, subType 3, consumer_id 4, request_id 5,
    # consumer_name 6, initialPosition 13 (Earliest = 1)
    return frame(wire.SUBSCRIBE, wire.f_bytes(1, topic) + wire.f_bytes(2, subscription)
                 + wire.f_varint(3, sub_type) + wire.f_varint(4, consumer_id)
                 + wire.f_varint(5, request_id) + wire.f_bytes(6, consumer_name)
                 + wire.f_varint(13, 1))


def producer_frame(topic, producer_id, request_id, access_mode, producer_name=None):
    # CommandProducer: topic 1, producer_id 2, request_id 3, producer_name 4,
    # producer_access_mode 10
    body = wire.f_bytes(1, topic) + wire.f_varint(2, producer_id) + wire.f_varint(3, request_id)
    if producer_name:
        body += wire.f_bytes(4, producer_name)
    return frame(wire.PRODUCER, body + wire.f_varint(10, access_mode))


def close_producer_frame(producer_id, request_id):
    # CommandCloseProducer: producer_id 1, request_id 2
    return frame(CLOSE_PRODUCER, wire.f_varint(1, producer_id) + wire.f_varint(2, request_id))


def ping_frame():
    return wire.simple_frame(wire.base_command(wire.PING, wire.PING, b""))


def lookup(conn, topic, request_id):
    conn.send(wire.simple_frame(wire.cmd_lookup(topic, request_id)))
    fields = conn.expect(wire.LOOKUP_RESPONSE)
    assert fields.get(4) == [request_id] or 4 not in fields, fields
    return fields


def send_message(conn, producer_id, producer_name, sequence_id, payload):
    """SEND one message and wait for its SEND_RECEIPT."""
    meta = wire.message_metadata(producer_name, sequence_id, int(time.time() * 1000))
    conn.send(wire.payload_frame(wire.cmd_send(producer_id, sequence_id), meta, payload))
    return conn.expect(wire.SEND_RECEIPT)


class Watcher:
    """Reads frames from several raw connections at once, noting when each arrived (time from
    `start`). PINGs from the broker are answered and not recorded."""

    def __init__(self, **conns):
        self.conns = conns
        self.start = time.monotonic()
        self.frames = {label: [] for label in conns}  # label -> [(type, fields, seconds)]

    def poll(self, slice_s=0.02):
        for label, conn in self.conns.items():
            try:
                type_, fields = conn.read_frame(timeout=slice_s)
            except socket.timeout:
                continue
            if type_ == wire.PING:
                conn.send(wire.simple_frame(wire.base_command(wire.PONG, wire.PONG, b"")))
                continue
            self.frames[label].append((type_, fields, time.monotonic() - self.start))

    def wait(self, done, timeout, what):
        """Polls until done(frames) is true; fails after timeout seconds."""
        deadline = time.monotonic() + timeout
        while not done(self.frames):
            if time.monotonic() > deadline:
                raise AssertionError("%s: not seen within %.0f s; frames so far: %s"
                                     % (what, timeout, self.describe()))
            self.poll()

    def first(self, label, type_):
        """(index, fields, seconds) of the first frame of that type on that connection."""
        for i, (t, fields, at) in enumerate(self.frames[label]):
            if t == type_:
                return i, fields, at
        return None

    def describe(self):
        return {label: [(name(t), round(at, 3)) for t, _, at in frames]
                for label, frames in self.frames.items()}
