"""Advertised listeners (Pulsar's `advertisedListeners` / `internalListenerName`) and a client's
`listenerName`: a LOOKUP naming a listener is answered that listener's URL, one naming none the
internal listener's, and one naming a listener the broker does not have fails with
ServiceNotReady "the broker do not have X listener" (the text the C++-based clients turn into a
connect error, as Pulsar's `test_listener_name_client` expects). The HTTP lookup takes the name
from `?listenerName=` or the `X-Pulsar-ListenerName` header. With several brokers, a lookup on any
of them is answered the owner's URL for the listener named (each broker registers its listeners),
and the official client given one broker and a listener name reaches a topic another owns."""

import json
import os

import pulsar
import pytest

import conftest
import pulsar_wire as wire
from compat_util import http_request, unique_topic

SERVICE_NOT_READY = 6  # ServerError


def _lookup(conn, topic, request_id, listener=None):
    body = wire.f_bytes(1, topic) + wire.f_varint(2, request_id) + wire.f_varint(3, 0)
    if listener is not None:
        body += wire.f_bytes(7, listener)  # advertised_listener_name
    conn.send(wire.simple_frame(wire.base_command(wire.LOOKUP, 23, body)))
    return conn.expect(wire.LOOKUP_RESPONSE)


def _round_trip(service_url, listener, topic, payload):
    """Produces `payload` and consumes it with the official client naming `listener`."""
    client = pulsar.Client(service_url, listener_name=listener, operation_timeout_seconds=10)
    try:
        producer = client.create_producer(topic)
        consumer = client.subscribe(topic, "s")
        producer.send(payload)
        assert consumer.receive(timeout_millis=10_000).data() == payload
    finally:
        client.close()


def test_a_listener_the_broker_does_not_have_fails_the_client(server):
    # Pulsar's python test_listener_name_client: no listeners configured, listener "test".
    client = pulsar.Client(server.service_url, listener_name="test", operation_timeout_seconds=10)
    try:
        with pytest.raises(pulsar.PulsarException):
            client.create_producer(unique_topic("listener-missing"))
    finally:
        client.close()
    with wire.RawConnection(server.service_url) as conn:
        conn.handshake()
        fields = _lookup(conn, unique_topic("listener-missing"), 1, "test")
        assert fields[6] == [SERVICE_NOT_READY], fields
        assert fields[7] == [b"the broker do not have test listener"], fields


@pytest.fixture(scope="module")
def listeners_server():
    def configure(srv):
        # The listeners name this broker's own port under two host names.
        with open(os.path.join(srv._tmp, "private.toml"), "a") as f:
            f.write('advertised_listeners = "internal:pulsar://127.0.0.1:%d,'
                    'external:pulsar://localhost:%d"\n' % (srv.broker_port, srv.broker_port))
        return srv.cmd
    with conftest.private_server("[broker]\n", wrap=configure) as srv:
        yield srv


def test_lookups_answer_the_named_listener(listeners_server):
    srv = listeners_server
    topic = unique_topic("listeners")
    with wire.RawConnection(srv.service_url) as conn:
        conn.handshake()
        external = _lookup(conn, topic, 1, "external")
        assert external[1] == [b"pulsar://localhost:%d" % srv.broker_port], external
        internal = _lookup(conn, topic, 2, "internal")
        assert internal[1] == [b"pulsar://127.0.0.1:%d" % srv.broker_port], internal
        unnamed = _lookup(conn, topic, 3)
        assert unnamed[1] == internal[1], unnamed
        missing = _lookup(conn, topic, 4, "nope")
        assert missing[7] == [b"the broker do not have nope listener"], missing

    # The official client follows the external listener's URL and works through it.
    _round_trip(srv.service_url, "external", topic, b"through-external")

    path = "/lookup/v2/topic/persistent/public/default/%s" % topic.rsplit("/", 1)[1]
    status, body = http_request("GET", srv.web_url + path + "?listenerName=external")
    assert status == 200 and json.loads(body)["brokerUrl"] == "pulsar://localhost:%d" % (
        srv.broker_port), (status, body)
    status, body = http_request("GET", srv.web_url + path,
                                headers={"X-Pulsar-ListenerName": "internal"})
    assert status == 200 and json.loads(body)["brokerUrl"] == "pulsar://127.0.0.1:%d" % (
        srv.broker_port), (status, body)
    status, body = http_request("GET", srv.web_url + path + "?listenerName=nope")
    assert status == 500 and b"the broker do not have nope listener" in body, (status, body)


def test_listener_configuration_is_checked_before_start(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text('[broker]\nadvertised_listeners = ":pulsar://127.0.0.1:6650"\n')
    import subprocess
    proc = subprocess.run([conftest.magnetar_binary(), "standalone", "--config", str(config),
                           "--data-dir", str(tmp_path / "data")],
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert proc.returncode != 0
    assert "do not contain listener name" in proc.stderr, proc.stderr
    assert not (tmp_path / "data").exists(), "validated before any data is opened"


@pytest.fixture(scope="module")
def listeners_cluster(tmp_path_factory):
    """Two `magnetar broker`s on etcd, each with an internal and an external listener (the same
    ports under 127.0.0.1 and localhost), binary and HTTP."""
    from replicated_util import replicated_cluster, skip_unless_own_magnetar
    skip_unless_own_magnetar()

    def listeners(srv):
        return ('[broker]\nadvertised_listeners = "internal:pulsar://127.0.0.1:{b},'
                'internal:http://127.0.0.1:{w},external:pulsar://localhost:{b},'
                'external:http://localhost:{w}"\n').format(b=srv.broker_port, w=srv.web_port)
    with replicated_cluster(tmp_path_factory.mktemp("listeners")) as (_, _, start_broker):
        yield [start_broker("l%d" % i, listeners) for i in range(2)]


def test_every_broker_answers_the_owners_listener(listeners_cluster):
    # A lookup answered with another broker (the owner of the topic's bundle) carries that
    # broker's URL for the listener the client names (Pulsar's owner `advertisedListeners`).
    first, second = listeners_cluster
    ns = "public/listeners-%d" % os.getpid()
    status, body = http_request("PUT", first.web_url + "/admin/v2/namespaces/" + ns,
                                json.dumps({"bundles": {"numBundles": 8}}))
    assert status in (200, 204), (status, body)
    with wire.RawConnection(first.service_url) as conn:
        conn.handshake()
        # Look topics up until one is the second broker's (the bundles spread over both).
        for i in range(64):
            topic = "persistent://%s/t-%d" % (ns, i)
            unnamed = _lookup(conn, topic, 10 + 4 * i)
            if unnamed[1] == [b"pulsar://127.0.0.1:%d" % second.broker_port]:
                break
        else:
            pytest.fail("no topic of 64 in 8 bundles went to the second broker")
        external = _lookup(conn, topic, 11 + 4 * i, "external")
        assert external[1] == [b"pulsar://localhost:%d" % second.broker_port], external
        internal = _lookup(conn, topic, 12 + 4 * i, "internal")
        assert internal[1] == unnamed[1], internal
        missing = _lookup(conn, topic, 13 + 4 * i, "nope")
        assert missing[6] == [SERVICE_NOT_READY], missing
        assert missing[7] == [b"the broker do not have nope listener"], missing

    # The official client, given the first broker and the external listener, reaches the topic
    # on the second broker through its external URL.
    _round_trip(first.service_url, "external", topic, b"to-the-owner-through-external")

    path = "/lookup/v2/topic/" + topic.replace("://", "/")
    status, body = http_request("GET", first.web_url + path + "?listenerName=external")
    assert status == 200, (status, body)
    answer = json.loads(body)
    assert answer["brokerUrl"] == "pulsar://localhost:%d" % second.broker_port, answer
    assert answer["httpUrl"] == "http://localhost:%d" % second.web_port, answer
    status, body = http_request("GET", first.web_url + path,
                                headers={"X-Pulsar-ListenerName": "internal"})
    assert status == 200, (status, body)
    assert json.loads(body)["brokerUrl"] == "pulsar://127.0.0.1:%d" % second.broker_port, body
    status, body = http_request("GET", first.web_url + path + "?listenerName=nope")
    assert status == 500 and b"the broker do not have nope listener" in body, (status, body)
