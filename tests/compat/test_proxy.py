"""`magnetar proxy` in front of two brokers on etcd (tests/compat/replicated_util.py), with the
official Python client given only the proxy's URL:

- lookups through the proxy reach every broker (a namespace's four bundles over both), produce and
  consume work on each, a partitioned topic too (PARTITIONED_METADATA answered through it);
- a queue checker runs through a namespace unload under load (no send error, every send once, in
  order), with the Python client and with the official Java client (tests/java
  ClusterBrokersThroughProxyTest); the official Go client (tests/go/proxy_test.go) produces and
  consumes through the proxy;
- the admin API through the proxy's web port: pulsar-admin (namespaces, topic stats and lookups,
  which the proxy follows to each topic's owner), and against secured brokers the caller's own
  token is what the broker checks;
- TLS at the proxy: a client of `pulsar+ssl://` (the proxy's certificate) produces and consumes
  on brokers it reaches in plain text through the proxy;
- our own client (`magnetar perf produce`) through the proxy too;
- the proxy is no open relay: a CONNECT naming an address that is not a registered broker is
  refused (ServiceNotReady) and closed, and a PRODUCER on a lookup connection is refused;
- against secured brokers (tokens, authorization, `proxy_roles`): the proxy authenticates the
  client and connects with its own token, naming the client (`original_principal`); the broker
  authorizes the client's role, not the proxy's: a granted role produces and consumes, a role
  without permission is refused (AuthorizationError) though the proxy's role may connect, and a
  bad token is refused at the proxy (AuthenticationError).

Skipped without etcd unless MAGNETAR_REQUIRE_ETCD=1; skipped on an external broker."""

import http.client
import json
import os
import subprocess
import urllib.parse

import pulsar
import pytest

import conftest
import pulsar_wire as wire
from auth_util import Keys, bearer
from compat_util import free_port, http_request, receive_n
from pulsar_admin import PulsarAdmin, pulsar_admin_available
from go_runner import BUILD_AND_RUN_TIMEOUT_S as GO_BUILD_AND_RUN_TIMEOUT_S
from go_runner import needs_go, run_go_test
from java_runner import BUILD_AND_RUN_TIMEOUT_S as JAVA_BUILD_AND_RUN_TIMEOUT_S
from java_runner import needs_java, run_java_tests
from replicated_util import CLUSTER, replicated_cluster, skip_unless_own_magnetar
from tls_certs import Certs

pytestmark = pytest.mark.restarts_server

START_TIMEOUT_S = 30


class Proxy:
    """A `magnetar proxy` process on a free loopback port; killed by PID on close."""

    def __init__(self, etcd, directory, toml=""):
        self.port, self.web_port = free_port(), free_port()
        while self.web_port == self.port:
            self.web_port = free_port()
        self.url = "pulsar://127.0.0.1:%d" % self.port
        self.web_url = "http://127.0.0.1:%d" % self.web_port
        config = os.path.join(directory, "proxy.toml")
        with open(config, "w") as f:
            f.write('[proxy]\nbind_address = "127.0.0.1"\n' + toml)
        self.log_path = os.path.join(directory, "proxy.log")
        self._log = open(self.log_path, "ab")
        cmd = [conftest.magnetar_binary(), "proxy", "--metadata", etcd.url, "--cluster", CLUSTER,
               "--port", str(self.port), "--web-port", str(self.web_port), "--config", config]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log,
                                     stdin=subprocess.DEVNULL, env=dict(os.environ, NO_COLOR="1"))
        # Bounded: the process prints each listener (the web one last), or exits.
        lines = []
        while not lines or "proxy serving http://" not in lines[-1]:
            line = self.proc.stdout.readline().decode()
            lines.append(line)
            if not line or len(lines) > 3:
                self.close()
                pytest.fail("the proxy did not start: %r\n%s" % (lines, self.log_tail()))
        if "proxy serving pulsar://" not in lines[0]:
            self.close()
            pytest.fail("the proxy did not start: %r\n%s" % (lines, self.log_tail()))

    def log_tail(self):
        with open(self.log_path, "rb") as f:
            return f.read()[-3000:].decode(errors="replace")

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()  # by PID
        self.proc.wait(30)
        self._log.close()


def _namespace(broker, name, deduplication=False):
    """A namespace of four bundles (deduplication on if asked), created through `broker`."""
    ns = "public/%s-%d" % (name, os.getpid())
    status, body = http_request("PUT", broker.web_url + "/admin/v2/namespaces/" + ns,
                                json.dumps({"bundles": {"numBundles": 4}}))
    assert status in (200, 204), (status, body)
    if deduplication:
        status, body = http_request("POST", "%s/admin/v2/namespaces/%s/deduplication"
                                    % (broker.web_url, ns), "true")
        assert status in (200, 204), (status, body)
    return ns


def _one_message_each(client, ns, topics, label):
    """On topics t-0 .. t-(topics - 1) of `ns`: one message produced and consumed on each."""
    for i in range(topics):
        topic = "persistent://%s/t-%d" % (ns, i)
        producer = client.create_producer(topic, batching_enabled=False)
        consumer = client.subscribe(topic, "s")
        producer.send(b"%s %d" % (label, i))
        assert receive_n(consumer, 1)[0].data() == b"%s %d" % (label, i)


def _owner(broker, topic):
    status, body = http_request("GET", "%s/lookup/v2/topic/%s"
                                % (broker.web_url, topic.replace("://", "/")),
                                headers=getattr(broker, "health_headers", None))
    assert status == 200, (status, body)
    return json.loads(body)["brokerUrl"]


def _put_following_redirects(url, body):
    """A PUT, sent again where a 307 points (a topic operation goes to the owner's broker)."""
    for _ in range(3):
        status, answer, headers = _request("PUT", url, body)
        if status != 307:
            return status, answer
        url = headers["location"]
    return status, answer


def _request(method, url, body):
    parsed = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
    try:
        connection.request(method, parsed.path, body=body,
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read(), {k.lower(): v for k, v in response.getheaders()}
    finally:
        connection.close()


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    skip_unless_own_magnetar()
    tmp = tmp_path_factory.mktemp("proxy")
    with replicated_cluster(tmp) as (etcd, _, start_broker):
        brokers = [start_broker("b%d" % i) for i in range(2)]
        certs = Certs(str(tmp / "certs"))
        ca = certs.ca("proxy-ca")
        leaf = certs.leaf(ca, "proxy")
        tls_port = free_port()
        proxy = Proxy(etcd, str(tmp), "[tls]\nenabled = true\ncert_file = %s\nkey_file = %s\n"
                      "broker_port_tls = %d\n" % (json.dumps(leaf["cert"]),
                                                  json.dumps(leaf["key"]), tls_port))
        proxy.tls_url, proxy.ca = "pulsar+ssl://127.0.0.1:%d" % tls_port, ca["cert"]
        try:
            yield brokers, proxy
        finally:
            proxy.close()


def test_clients_reach_every_broker_through_the_proxy(plain):
    brokers, proxy = plain
    ns = _namespace(brokers[0], "proxied")
    client = pulsar.Client(proxy.url, operation_timeout_seconds=30)
    owners = set()
    try:
        for i in range(8):
            topic = "persistent://%s/t-%d" % (ns, i)
            producer = client.create_producer(topic, batching_enabled=False)
            consumer = client.subscribe(topic, "s")
            for j in range(5):
                producer.send(b"%d-%d" % (i, j))
            got = [m.data() for m in receive_n(consumer, 5)]
            assert got == [b"%d-%d" % (i, j) for j in range(5)], got
            owners.add(_owner(brokers[0], topic))
        assert len(owners) == 2, "the topics' owners, each reached through the proxy: %s" % owners

        topic = "persistent://%s/partitioned" % ns
        path = "/admin/v2/persistent/%s/partitioned/partitions" % ns
        status, body = _put_following_redirects(brokers[1].web_url + path, "3")
        assert status in (200, 204), (status, body)
        producer = client.create_producer(topic, batching_enabled=False)
        consumer = client.subscribe(topic, "s")
        for j in range(9):
            producer.send(b"p-%d" % j, partition_key="k%d" % j)
        got = sorted(m.data() for m in receive_n(consumer, 9))
        assert got == sorted(b"p-%d" % j for j in range(9)), got
    finally:
        client.close()
    assert "proxy started" in proxy.log_tail()


def test_the_proxy_is_no_open_relay(plain):
    _, proxy = plain
    # A CONNECT naming an address that is not a registered broker (here the proxy's own port).
    target = "127.0.0.1:%d" % proxy.port
    connect = wire.base_command(wire.CONNECT, 2, wire.f_bytes(1, "raw") + wire.f_varint(4, 21)
                                + wire.f_bytes(6, target))
    with wire.RawConnection(proxy.url) as conn:
        conn.send(wire.simple_frame(connect))
        error = conn.expect(wire.ERROR)
        assert error[2][0] == 6, error  # ServerError.ServiceNotReady
        assert target.encode() in error[3][0], error
        with pytest.raises(wire.Closed):
            conn.read_frame(timeout=5)
    # Producers connect through the proxy to their broker, never on a lookup connection.
    with wire.RawConnection(proxy.url) as conn:
        conn.send(wire.simple_frame(wire.cmd_connect()))
        conn.expect(wire.CONNECTED)
        conn.send(wire.simple_frame(wire.cmd_producer("persistent://public/default/x", 1, 1)))
        error = conn.expect(wire.ERROR)
        assert error[2][0] == 22, error  # ServerError.NotAllowedError
    # An old protocol version is refused as Pulsar's proxy refuses it.
    with wire.RawConnection(proxy.url) as conn:
        conn.send(wire.simple_frame(wire.cmd_connect(protocol_version=6)))
        error = conn.expect(wire.ERROR)
        assert error[2][0] == 10, error  # ServerError.UnsupportedVersionError


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    skip_unless_own_magnetar()
    tmp = tmp_path_factory.mktemp("proxy-secured")
    keys = Keys(str(tmp))
    admin = keys.hs_token("admin")
    toml = keys.secret_toml() + ('[authorization]\nenabled = true\nsuper_user_roles = ["admin"]\n'
                                 'proxy_roles = ["proxy"]\n')
    with replicated_cluster(tmp) as (etcd, _, start_broker):
        brokers = [start_broker("s%d" % i, toml, health_headers=bearer(admin)) for i in range(2)]
        token_file = os.path.join(str(tmp), "proxy.token")
        with open(token_file, "w") as f:
            f.write(keys.hs_token("proxy"))
        proxy = Proxy(etcd, str(tmp), 'broker_client_token_file = "%s"\n%s'
                      % (token_file, keys.secret_toml()))
        try:
            yield brokers, proxy, keys, admin
        finally:
            proxy.close()


def test_a_secured_broker_authorizes_the_client_the_proxy_names(secured):
    brokers, proxy, keys, admin = secured
    ns = "public/secured-%d" % os.getpid()
    web = brokers[0].web_url
    status, body = http_request("PUT", web + "/admin/v2/namespaces/" + ns,
                                json.dumps({"bundles": {"numBundles": 4}}), headers=bearer(admin))
    assert status in (200, 204), (status, body)
    status, body = http_request("POST", "%s/admin/v2/namespaces/%s/permissions/alice" % (web, ns),
                                json.dumps(["produce", "consume"]), headers=bearer(admin))
    assert status in (200, 204), (status, body)

    alice = pulsar.Client(proxy.url, authentication=pulsar.AuthenticationToken(
        keys.hs_token("alice")), operation_timeout_seconds=30)
    try:
        _one_message_each(alice, ns, 4, b"from alice")
    finally:
        alice.close()

    # bob connects (the proxy's role may), but the broker authorizes bob, who may not produce.
    bob = pulsar.Client(proxy.url, authentication=pulsar.AuthenticationToken(
        keys.hs_token("bob")), operation_timeout_seconds=10)
    try:
        with pytest.raises(pulsar.AuthorizationError):
            bob.create_producer("persistent://%s/t-0" % ns)
    finally:
        bob.close()

    forged = pulsar.Client(proxy.url, authentication=pulsar.AuthenticationToken(
        keys.hs_token("alice")[:-4] + "AAAA"), operation_timeout_seconds=10)
    try:
        # Refused at the proxy; the client retries its connection until its operation timeout
        # (as it does against a broker that refuses a credential).
        with pytest.raises((pulsar.AuthenticationError, pulsar.Timeout, pulsar.ConnectError)):
            forged.create_producer("persistent://%s/t-0" % ns)
    finally:
        forged.close()
    assert "authentication failed" in proxy.log_tail() and "token signature" in proxy.log_tail()

    # The admin API through the proxy: the caller's token goes to the broker, which checks it.
    path = "/admin/v2/namespaces/public"
    status, body = http_request("GET", proxy.web_url + path, headers=bearer(admin))
    assert status == 200 and ns in json.loads(body), (status, body)
    status, body = http_request("GET", proxy.web_url + path, headers=bearer(keys.hs_token("bob")))
    assert status == 403, (status, body)
    status, body = http_request("GET", proxy.web_url + path)
    assert status == 401, (status, body)


def test_an_unload_under_load_through_the_proxy_reaches_no_application(plain):
    brokers, proxy = plain
    ns = _namespace(brokers[0], "proxied-unload", deduplication=True)
    topic = "persistent://%s/queue" % ns
    client = pulsar.Client(proxy.url, operation_timeout_seconds=30)
    try:
        # The checker's subscription first, so that no closed ledger is trimmed before it.
        client.subscribe(topic, "check", initial_position=pulsar.InitialPosition.Earliest).close()
        producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=30000)
        owner = _owner(brokers[0], topic)
        acked = []
        for i in range(200):
            if i == 100:  # the namespace unloaded mid-stream: the bundle goes to the other broker
                status, body = http_request("PUT", "%s/admin/v2/namespaces/%s/unload"
                                            % (brokers[1].web_url, ns))
                assert status in (200, 204), (status, body)
            producer.send(b"%d" % i, sequence_id=i)  # an error here reaches the application
            acked.append(i)
        assert _owner(brokers[0], topic) != owner, "the unloaded bundle stayed on its broker"
        consumer = client.subscribe(topic, "check")
        got = [int(m.data()) for m in receive_n(consumer, len(acked))]
        assert got == acked, "every acknowledged send once, in order"
    finally:
        client.close()


@needs_go
@pytest.mark.timeout(GO_BUILD_AND_RUN_TIMEOUT_S + 120)
def test_the_go_client_reaches_every_broker_through_the_proxy(plain):
    brokers, proxy = plain
    ns = _namespace(brokers[0], "proxied-go")
    env = {"MAGNETAR_TEST_PROXY_URL": proxy.url, "MAGNETAR_TEST_NAMESPACE": ns,
           "MAGNETAR_TEST_WEB_URLS": ",".join(b.web_url for b in brokers)}
    out = run_go_test("brokers", "TestTheProxyIsOneAddressForEveryBroker", env)
    assert "produced and consumed through the proxy" in out, out[-3000:]


def test_pulsar_admin_works_through_the_proxy(plain):
    brokers, proxy = plain
    ns = "public/proxied-admin-%d" % os.getpid()
    status, body = http_request("PUT", proxy.web_url + "/admin/v2/namespaces/" + ns,
                                json.dumps({"bundles": {"numBundles": 4}}))
    assert status in (200, 204), (status, body)
    client = pulsar.Client(proxy.url, operation_timeout_seconds=30)
    topics = ["persistent://%s/t-%d" % (ns, i) for i in range(6)]
    try:
        for topic in topics:
            client.create_producer(topic).send(b"x")
    finally:
        client.close()
    owners = {_owner(brokers[0], t) for t in topics}
    # Topic operations are the owner's: a broker that does not own the topic answers 307, which
    # the proxy follows itself (to registered brokers only).
    for topic in topics:
        path = "/admin/v2/%s/stats" % topic.replace("://", "/")
        status, body = http_request("GET", proxy.web_url + path)
        assert status == 200 and json.loads(body)["msgInCounter"] == 1, (status, body)
    status, body = http_request("GET", proxy.web_url + "/metrics")
    assert status == 404 and b"/admin/" in body, (status, body)
    if not pulsar_admin_available():
        return
    admin = PulsarAdmin(proxy.web_url)
    assert ns in admin("namespaces", "list", "public")
    for topic in topics:
        assert admin("topics", "lookup", topic).strip() in owners
        assert json.loads(admin("topics", "stats", topic))["msgInCounter"] == 1
    listed = admin("brokers", "list", CLUSTER)
    assert all(b.web_url.split("://", 1)[1] in listed for b in brokers), listed


def test_a_tls_client_of_the_proxy_reaches_the_brokers(plain):
    brokers, proxy = plain
    ns = _namespace(brokers[0], "proxied-tls")
    client = pulsar.Client(proxy.tls_url, tls_trust_certs_file_path=proxy.ca,
                           operation_timeout_seconds=30)
    try:
        _one_message_each(client, ns, 4, b"over tls")
    finally:
        client.close()


@needs_java
@pytest.mark.timeout(JAVA_BUILD_AND_RUN_TIMEOUT_S + 120)
def test_the_java_client_goes_through_the_proxy_and_an_unload(plain):
    brokers, proxy = plain
    ns = _namespace(brokers[0], "proxied-java", deduplication=True)
    env = {"MAGNETAR_TEST_PROXY_URL": proxy.url, "MAGNETAR_TEST_PROXY_WEB_URL": proxy.web_url,
           "MAGNETAR_TEST_NAMESPACE": ns}
    passed = run_java_tests(env, "ClusterBrokersThroughProxyTest")
    assert passed == ["ClusterBrokersThroughProxyTest.theProxyIsOneAddressForEveryBroker"], passed


def test_our_own_client_reaches_the_owner_through_the_proxy(plain):
    """`magnetar perf` (crates/client) names the owner in `proxy_to_broker_url` as the official
    clients do, on its own connection through the proxy."""
    brokers, proxy = plain
    ns = _namespace(brokers[0], "proxied-perf")
    topic = "persistent://%s/perf" % ns
    done = subprocess.run([conftest.magnetar_binary(), "perf", "produce", "-u", proxy.url,
                           "-m", "200", "--json", topic], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    stream = next(s for s in json.loads(done.stdout)["streams"] if s["name"] == "publish")
    assert stream["messages"] == 200 and stream["errors"] == 0, stream
