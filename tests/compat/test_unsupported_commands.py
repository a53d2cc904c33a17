"""Known commands the broker does not serve are refused with an error for their request id; the
connection stays open and usable.

Pulsar's ServerCnx answers every transaction command with ERROR(NotAllowedError, "Transactions
are not enabled.") when transactionCoordinatorEnabled=false (standalone's default), and goes on
serving the connection. (Bytes that do not decode as a command at all, e.g. an unknown command
type, are another matter: Pulsar closes the connection, see test_bad_input.py.)"""

import pytest

from compat_util import check_round_trip, unique_topic
import pulsar_wire as wire
import raw_frames as raw

REQUEST_ID = 4242


def _txn_commands(topic):
    """(type, body) of transaction commands, each with request_id = REQUEST_ID (field 1)."""
    rid = wire.f_varint(1, REQUEST_ID)
    txn = wire.f_varint(2, 1) + wire.f_varint(3, 0)  # txnid_least_bits, txnid_most_bits
    subscription = wire.f_bytes(1, topic) + wire.f_bytes(2, "sub")  # Subscription{topic, subscription}
    return {
        "NEW_TXN": (raw.NEW_TXN, rid + wire.f_varint(2, 60_000) + wire.f_varint(3, 0)),
        "ADD_PARTITION_TO_TXN": (raw.ADD_PARTITION_TO_TXN, rid + txn + wire.f_bytes(4, topic)),
        "ADD_SUBSCRIPTION_TO_TXN": (raw.ADD_SUBSCRIPTION_TO_TXN,
                                    rid + txn + wire.f_bytes(4, subscription)),
        "END_TXN": (raw.END_TXN, rid + txn + wire.f_varint(4, 0)),  # txn_action COMMIT
        "TC_CLIENT_CONNECT_REQUEST": (raw.TC_CLIENT_CONNECT_REQUEST, rid + wire.f_varint(2, 0)),
    }


def _assert_refused(conn, what):
    """The broker answers ERROR for REQUEST_ID with a message, and does not close."""
    kind, fields = conn.error_or_close(timeout=10)
    assert kind != "closed", "%s closed the connection (frames before: %r)" % (what, fields)
    assert kind == wire.ERROR, "%s answered %s %r, want ERROR" % (what, raw.name(kind), fields)
    # CommandError: request_id 1, error 2, message 3
    assert fields[1] == [REQUEST_ID], "%s: ERROR for request %r, want %d" % (
        what, fields[1], REQUEST_ID)
    assert fields[2][0] in (raw.NOT_ALLOWED_ERROR, raw.UNKNOWN_ERROR), (
        "%s: ServerError %d, want NotAllowedError (Pulsar) or UnknownError" % (what, fields[2][0]))
    assert fields.get(3, [b""])[0], "%s: ERROR without a message" % what


def _assert_still_usable(conn, topic):
    conn.send(raw.ping_frame())
    conn.expect(wire.PONG, timeout=5)
    raw.lookup(conn, topic, 1)
    conn.send(raw.producer_frame(topic, 1, 2, raw.ACCESS_SHARED))
    producer_name = conn.expect(wire.PRODUCER_SUCCESS)[2][0].decode()
    receipt = raw.send_message(conn, 1, producer_name, 0, b"after-the-refusal")
    assert receipt[1] == [1] and receipt[2] == [0], receipt


@pytest.mark.parametrize("command", sorted(_txn_commands("t")))
def test_unsupported_command_is_refused_and_connection_stays_open(server, command):
    topic = unique_topic("unsupported")
    type_, body = _txn_commands(topic)[command]
    with wire.RawConnection(server.service_url) as conn:
        conn.handshake()
        conn.send(raw.frame(type_, body))
        _assert_refused(conn, command)
        _assert_still_usable(conn, topic)
    check_round_trip(server)


def test_unsupported_commands_between_normal_traffic(server):
    """A producer keeps its connection through a series of refused commands."""
    topic = unique_topic("unsupported-mixed")
    with wire.RawConnection(server.service_url) as conn:
        conn.handshake()
        raw.lookup(conn, topic, 1)
        conn.send(raw.producer_frame(topic, 1, 2, raw.ACCESS_SHARED))
        producer_name = conn.expect(wire.PRODUCER_SUCCESS)[2][0].decode()
        for seq, (command, (type_, body)) in enumerate(sorted(_txn_commands(topic).items())):
            raw.send_message(conn, 1, producer_name, seq, b"m%d" % seq)
            conn.send(raw.frame(type_, body))
            _assert_refused(conn, command)
        conn.send(raw.ping_frame())
        conn.expect(wire.PONG, timeout=5)
