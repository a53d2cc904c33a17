"""Just enough of the Pulsar binary protocol, by hand, to send malformed input over a raw socket.

Wire facts (field numbers, enum values, framing) are those of PulsarApi.proto and the Pulsar
protocol documentation:
  simple frame:  [total_size u32][command_size u32][BaseCommand]
  payload frame: [total_size u32][command_size u32][BaseCommand][0x0e01 u16][crc32c u32]
                 [metadata_size u32][MessageMetadata][payload]
  (big-endian; total_size counts everything after itself; the CRC-32C covers everything after it)
"""

import socket
import struct
import time
import urllib.parse

# BaseCommand.Type values
CONNECT, CONNECTED, SUBSCRIBE, PRODUCER, SEND, SEND_RECEIPT, SEND_ERROR = 2, 3, 4, 5, 6, 7, 8
MESSAGE, FLOW = 9, 11
SUCCESS, ERROR, PRODUCER_SUCCESS, PING, PONG = 13, 14, 17, 18, 19
LOOKUP, LOOKUP_RESPONSE = 23, 24
TYPE_NAMES = {2: "CONNECT", 3: "CONNECTED", 4: "SUBSCRIBE", 5: "PRODUCER", 6: "SEND",
              7: "SEND_RECEIPT", 8: "SEND_ERROR", 9: "MESSAGE", 11: "FLOW", 13: "SUCCESS", 14: "ERROR",
              17: "PRODUCER_SUCCESS", 18: "PING", 19: "PONG", 23: "LOOKUP", 24: "LOOKUP_RESPONSE"}

CHECKSUM_ERROR = 9  # ServerError.ChecksumError

MAGIC_CRC32C = 0x0E01
MAX_FRAME = 5 * 1024 * 1024 + 10 * 1024  # default maxMessageSize + frame padding


# ---------------------------------------------------------------- protobuf (proto2) encoding
def varint(n):
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def f_varint(field, value):
    return varint(field << 3 | 0) + varint(value)


def f_bytes(field, value):
    if isinstance(value, str):
        value = value.encode()
    return varint(field << 3 | 2) + varint(len(value)) + value


def base_command(type_, field=None, body=b""):
    """BaseCommand{type = type_ (field 1), <field> = body (a nested message)}."""
    out = f_varint(1, type_)
    if field is not None:
        out += f_bytes(field, body)
    return out


def decode_fields(buf):
    """Top-level fields of a protobuf message: {field number: [values]} (ints or bytes)."""
    fields, i = {}, 0

    def read_varint():
        nonlocal i
        shift = result = 0
        while True:
            if i >= len(buf):
                raise ValueError("truncated varint")
            b = buf[i]
            i += 1
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7

    while i < len(buf):
        key = read_varint()
        field, wire = key >> 3, key & 7
        if wire == 0:
            val = read_varint()
        elif wire == 2:
            ln = read_varint()
            val = bytes(buf[i:i + ln])
            i += ln
        elif wire == 1:
            val = bytes(buf[i:i + 8])
            i += 8
        elif wire == 5:
            val = bytes(buf[i:i + 4])
            i += 4
        else:
            raise ValueError("unsupported wire type %d" % wire)
        fields.setdefault(field, []).append(val)
    return fields


# ---------------------------------------------------------------- commands
def cmd_connect(client_version="x", protocol_version=21):
    # CommandConnect: client_version = 1, protocol_version = 4
    return base_command(CONNECT, 2, f_bytes(1, client_version) + f_varint(4, protocol_version))


def cmd_lookup(topic, request_id):
    # CommandLookupTopic: topic = 1, request_id = 2, authoritative = 3
    return base_command(LOOKUP, 23, f_bytes(1, topic) + f_varint(2, request_id) + f_varint(3, 0))


def cmd_producer(topic, producer_id, request_id):
    # CommandProducer: topic = 1, producer_id = 2, request_id = 3
    return base_command(PRODUCER, 5, f_bytes(1, topic) + f_varint(2, producer_id)
                        + f_varint(3, request_id))


def cmd_subscribe(topic, subscription, consumer_id, request_id, earliest=True):
    # CommandSubscribe: topic = 1, subscription = 2, subType = 3 (Exclusive = 0),
    # consumer_id = 4, request_id = 5, initialPosition = 13 (Latest = 0, Earliest = 1)
    return base_command(SUBSCRIBE, 4, f_bytes(1, topic) + f_bytes(2, subscription)
                        + f_varint(3, 0) + f_varint(4, consumer_id) + f_varint(5, request_id)
                        + f_varint(13, 1 if earliest else 0))


def cmd_flow(consumer_id, permits):
    # CommandFlow: consumer_id = 1, messagePermits = 2
    return base_command(FLOW, 11, f_varint(1, consumer_id) + f_varint(2, permits))


def cmd_send(producer_id, sequence_id, num_messages=1):
    # CommandSend: producer_id = 1, sequence_id = 2, num_messages = 3
    return base_command(SEND, 6, f_varint(1, producer_id) + f_varint(2, sequence_id)
                        + f_varint(3, num_messages))


def message_metadata(producer_name, sequence_id, publish_time_ms):
    # MessageMetadata: producer_name = 1, sequence_id = 2, publish_time = 3
    return f_bytes(1, producer_name) + f_varint(2, sequence_id) + f_varint(3, publish_time_ms)


def cmd_send_chunk(producer_id, sequence_id):
    # CommandSend with is_chunk = 7 (what clients set on every chunk of a chunked message)
    return base_command(SEND, 6, f_varint(1, producer_id) + f_varint(2, sequence_id)
                        + f_varint(3, 1) + f_varint(7, 1))


def chunk_metadata(producer_name, sequence_id, publish_time_ms, uuid, num_chunks, total_size,
                   chunk_id):
    # MessageMetadata of one chunk: uuid = 26, num_chunks_from_msg = 27,
    # total_chunk_msg_size = 28, chunk_id = 29
    return (message_metadata(producer_name, sequence_id, publish_time_ms) + f_bytes(26, uuid)
            + f_varint(27, num_chunks) + f_varint(28, total_size) + f_varint(29, chunk_id))


# ---------------------------------------------------------------- framing
def simple_frame(cmd):
    return struct.pack(">II", 4 + len(cmd), len(cmd)) + cmd


_CRC_TABLE = []
for _n in range(256):
    _c = _n
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _CRC_TABLE.append(_c)


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def payload_frame(cmd, metadata, payload, corrupt_checksum=False):
    checked = struct.pack(">I", len(metadata)) + metadata + payload
    crc = crc32c(checked)
    if corrupt_checksum:
        crc ^= 0xDEADBEEF
    rest = struct.pack(">HI", MAGIC_CRC32C, crc) + checked
    return struct.pack(">II", 4 + len(cmd) + len(rest), len(cmd)) + cmd + rest


# ---------------------------------------------------------------- a raw connection
class Closed(Exception):
    pass


class RawConnection:
    def __init__(self, service_url, timeout=10.0):
        u = urllib.parse.urlparse(service_url)
        self.sock = socket.create_connection((u.hostname, u.port or 6650), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.buf = b""

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, data):
        """Sends bytes; returns False if the broker already closed the connection."""
        try:
            self.sock.sendall(data)
            return True
        except (BrokenPipeError, ConnectionResetError):
            return False

    def _fill(self, deadline):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise socket.timeout("deadline")
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(65536)
        except ConnectionResetError:
            raise Closed("reset")
        if not chunk:
            raise Closed("eof")
        self.buf += chunk

    def read_frame(self, timeout=None):
        """Next frame as (type, fields of the nested command). Raises Closed or socket.timeout."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while len(self.buf) < 4:
            self._fill(deadline)
        (total,) = struct.unpack(">I", self.buf[:4])
        while len(self.buf) < 4 + total:
            self._fill(deadline)
        frame, self.buf = self.buf[4:4 + total], self.buf[4 + total:]
        (cmd_size,) = struct.unpack(">I", frame[:4])
        base = decode_fields(frame[4:4 + cmd_size])
        type_ = base[1][0]
        nested = decode_fields(base[type_][0]) if type_ in base else {}
        return type_, nested

    def expect(self, want, timeout=None):
        """Reads frames (skipping PINGs, which it answers) until one of type `want`."""
        while True:
            type_, fields = self.read_frame(timeout)
            if type_ == PING:
                self.send(simple_frame(base_command(PONG, 19, b"")))
                continue
            if type_ != want:
                raise AssertionError("expected %s, got %s %r"
                                     % (TYPE_NAMES.get(want, want), TYPE_NAMES.get(type_, type_),
                                        fields))
            return fields

    def error_or_close(self, timeout=None):
        """Waits for the broker to reject what it got: an ERROR / SEND_ERROR frame or closing the
        connection. Returns ("closed", frames seen before) or (frame type, its fields); fails if
        the broker does neither in time."""
        deadline = time.monotonic() + (timeout or self.timeout)
        seen = []
        while True:
            try:
                type_, fields = self.read_frame(max(0.01, deadline - time.monotonic()))
            except Closed:
                return "closed", seen
            except socket.timeout:
                raise AssertionError("broker neither answered with an error nor closed the "
                                     "connection within %.0f s; frames seen: %r"
                                     % (timeout or self.timeout, seen))
            except (ValueError, KeyError, IndexError, struct.error) as e:
                raise AssertionError("broker sent an undecodable frame (%s)" % e)
            seen.append(TYPE_NAMES.get(type_, type_))
            if type_ in (ERROR, SEND_ERROR):
                return type_, fields
            if type_ == PING:
                self.send(simple_frame(base_command(PONG, 19, b"")))

    def handshake(self):
        self.send(simple_frame(cmd_connect()))
        return self.expect(CONNECTED)

    def open_producer(self, topic, producer_id=1, request_id=1):
        """LOOKUP (as clients do) then PRODUCER; returns the producer name."""
        self.send(simple_frame(cmd_lookup(topic, request_id)))
        self.expect(LOOKUP_RESPONSE)
        self.send(simple_frame(cmd_producer(topic, producer_id, request_id + 1)))
        fields = self.expect(PRODUCER_SUCCESS)
        return fields[2][0].decode()  # CommandProducerSuccess.producer_name = 2

    def subscribe(self, topic, subscription, consumer_id=1, request_id=100, permits=1000):
        """LOOKUP, an Exclusive SUBSCRIBE (a new subscription starts at the earliest message),
        then FLOW with `permits`."""
        self.send(simple_frame(cmd_lookup(topic, request_id)))
        self.expect(LOOKUP_RESPONSE)
        self.send(simple_frame(cmd_subscribe(topic, subscription, consumer_id, request_id + 1)))
        self.expect(SUCCESS)
        self.send(simple_frame(cmd_flow(consumer_id, permits)))

    def next_message_id(self, timeout=None):
        """(ledger_id, entry_id) of the next MESSAGE frame (its payload is not decoded)."""
        fields = self.expect(MESSAGE, timeout)
        msg_id = decode_fields(fields[2][0])  # CommandMessage.message_id = 2
        return msg_id[1][0], msg_id[2][0]  # MessageIdData: ledgerId = 1, entryId = 2

    def send_chunk(self, producer_id, producer_name, sequence_id, uuid, num_chunks, total_size,
                   chunk_id, data):
        """Sends one chunk of a chunked message and waits for its SEND_RECEIPT."""
        meta = chunk_metadata(producer_name, sequence_id, int(time.time() * 1000), uuid,
                              num_chunks, total_size, chunk_id)
        self.send(payload_frame(cmd_send_chunk(producer_id, sequence_id), meta, data))
        return self.expect(SEND_RECEIPT)
