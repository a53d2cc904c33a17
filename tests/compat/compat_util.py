"""Helpers shared by the compatibility tests (no fixtures here: see conftest.py)."""

import random
import socket
import time
import urllib.error
import urllib.request
import uuid

import pulsar

RECEIVE_TIMEOUT_MS = 10_000   # one message must arrive within this
QUIET_MS = 700                # "nothing more arrives": how long we listen for an unwanted message


_PORTS_GIVEN = set()


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def free_port():
    """A loopback TCP port nobody listens on, below the kernel's ephemeral range when it can.

    Ports the kernel hands out (bind to 0) are also the ones it gives every outgoing connection,
    so a port picked that way can be taken by some client socket before the server binds it
    (CI saw etcd fail with "address already in use"). Ports below the ephemeral range are only
    ever taken by a listener that asked for them; each is handed out once per test process."""
    low = _ephemeral_low()
    if low is not None and low > 12000:
        for _ in range(200):
            port = random.randrange(10000, low)
            if port in _PORTS_GIVEN:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _PORTS_GIVEN.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def eventually(what, check, deadline_s=20, every_s=0.2):
    """Polls check() until it returns a truthy value and returns it, for at most deadline_s:
    for effects with no event to wait on (a periodic broker pass, a rate window, a policy that
    Pulsar applies asynchronously)."""
    deadline = time.monotonic() + deadline_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, "%s: not within %d s" % (what, deadline_s)
        time.sleep(every_s)


def unique_topic(prefix="t"):
    return "persistent://public/default/%s-%s" % (prefix, uuid.uuid4().hex)


def short_name(topic):
    """persistent://public/default/x -> x"""
    return topic.rsplit("/", 1)[1]


def http_request(method, url, body=None, content_type="application/json", timeout=10,
                 headers=None):
    """Returns (status, body bytes). Does not raise on HTTP error statuses."""
    data = None if body is None else (body if isinstance(body, bytes) else str(body).encode())
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", content_type)
    req.add_header("Accept", "application/json")
    for name, value in (headers or {}).items():
        req.add_header(name, value)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def receive_n(consumer, n, timeout_ms=RECEIVE_TIMEOUT_MS, what="message"):
    """Receives exactly n messages, each within timeout_ms; fails the test otherwise."""
    got = []
    for _ in range(n):
        try:
            got.append(consumer.receive(timeout_millis=timeout_ms))
        except pulsar.Timeout:
            raise AssertionError("received only %d of %d %ss (then nothing for %d ms); got %r"
                                 % (len(got), n, what, timeout_ms,
                                    [m.data()[:40] for m in got[-5:]]))
    return got


def read_n(reader, n, timeout_ms=RECEIVE_TIMEOUT_MS):
    got = []
    for _ in range(n):
        try:
            got.append(reader.read_next(timeout_millis=timeout_ms))
        except pulsar.Timeout:
            raise AssertionError("reader got only %d of %d messages; got %r"
                                 % (len(got), n, [m.data()[:40] for m in got[-5:]]))
    return got


def assert_nothing_more(consumer_or_reader, wait_ms=QUIET_MS):
    """Asserts no further message arrives within wait_ms."""
    try:
        if isinstance(consumer_or_reader, pulsar.Reader):
            m = consumer_or_reader.read_next(timeout_millis=wait_ms)
        else:
            m = consumer_or_reader.receive(timeout_millis=wait_ms)
    except pulsar.Timeout:
        return
    raise AssertionError("unexpected extra message %r (id %s)" % (m.data()[:80], m.message_id()))


def drain(consumer, quiet_ms=3000, limit=1_000_000):
    """Receives until nothing arrives for quiet_ms (bounded by limit messages)."""
    got = []
    while len(got) < limit:
        try:
            got.append(consumer.receive(timeout_millis=quiet_ms))
        except pulsar.Timeout:
            break
    return got


def payloads(msgs):
    return [m.data().decode() for m in msgs]


def check_round_trip(server, prefix="health"):
    """A normal client can still produce and consume one message."""
    topic = unique_topic(prefix)
    client = server.client()
    try:
        consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic)
        body = ("still-alive-" + uuid.uuid4().hex).encode()
        producer.send(body)
        msg = consumer.receive(timeout_millis=RECEIVE_TIMEOUT_MS)
        assert msg.data() == body
        consumer.acknowledge(msg)
    finally:
        client.close()


def produce_and_consume(service_url, count, prefix="t"):
    """A fresh client sends `count` messages on a new topic and receives and acks each, in
    order (what a newcomer does first against a server the README started)."""
    client = pulsar.Client(service_url, operation_timeout_seconds=15, connection_timeout_ms=5000)
    try:
        topic = unique_topic(prefix)
        consumer = client.subscribe(topic, prefix)
        producer = client.create_producer(topic)
        sent = [("%s %d" % (prefix, i)).encode() for i in range(count)]
        for body in sent:
            producer.send(body)
        received = []
        for _ in sent:
            msg = consumer.receive(timeout_millis=RECEIVE_TIMEOUT_MS)
            received.append(msg.data())
            consumer.acknowledge(msg)
        assert received == sent
    finally:
        client.close()
