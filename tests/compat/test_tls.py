"""TLS with the official Python client (`pulsar+ssl://`) and the HTTPS admin API.

Each test starts a broker of its own with a `[tls]` section; certificates are made in the test
with the openssl CLI (tls_certs.py) into a temporary directory. Covered: produce/consume over
TLS with hostname verification on and off (a certificate whose name does not match works only
with it off), an untrusted server certificate refused, mTLS (the broker sees the client
certificate's CN; no or an untrusted client certificate refused when one is required), HTTPS
admin with the CA (and the TLS URLs it advertises), the plain ports turned off, certificate
reload within the refresh period, and garbage or stalled handshakes that leave others alone.
"""

import contextlib
import json
import os
import re
import shutil
import socket
import ssl
import tempfile
import time
import http.client
import urllib.error
import urllib.request

import pulsar
import pytest

import conftest
from compat_util import free_port as _free_port, unique_topic
from tls_certs import Certs

# The broker's bound on a TLS handshake (magnetar_security::tls::HANDSHAKE_TIMEOUT).
HANDSHAKE_TIMEOUT_S = 10
# What an HTTPS request that the server refuses during or right after the handshake raises.
REFUSED_HTTPS = (ssl.SSLError, ConnectionError, urllib.error.URLError, http.client.HTTPException)


@pytest.fixture(scope="module")
def certs():
    directory = tempfile.mkdtemp(prefix="magnetar-tls-certs-")
    try:
        c = Certs(directory)
        c.ca_main = c.ca("test-ca")
        c.server = c.leaf(c.ca_main, "localhost")
        c.alice = c.leaf(c.ca_main, "alice")
        c.ca_other = c.ca("stranger-ca")
        yield c
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _ssl_context(ca, client=None, check_hostname=True):
    ctx = ssl.create_default_context(cafile=ca)
    ctx.check_hostname = check_hostname
    if client:
        ctx.load_cert_chain(client["cert"], client["key"])
    return ctx


def https_get(url, ca, client=None, timeout=5):
    with urllib.request.urlopen(url, context=_ssl_context(ca, client), timeout=timeout) as r:
        return r.status, r.read()


def served_common_name(port, ca):
    """The subject CN of the certificate the server presents on `port` (verified with `ca`)."""
    ctx = _ssl_context(ca)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            subject = tls.getpeercert()["subject"]
    return dict(item[0] for item in subject)["commonName"]


@contextlib.contextmanager
def tls_server(cert, trust=None, require=False, plain=True, refresh=300, log_level="info",
               extra_toml=""):
    """A private broker with `[tls]` on free ports: `.tls_service_url`, `.tls_web_url`.
    `extra_toml` is appended to the configuration (other sections)."""
    if os.environ.get("MAGNETAR_TEST_SERVICE_URL") or os.environ.get("MAGNETAR_TEST_SERVER_CMD"):
        pytest.skip("needs a magnetar broker of its own with TLS")
    broker_tls, web_tls = _free_port(), _free_port()
    srv = conftest.Server()
    while web_tls == broker_tls or {broker_tls, web_tls} & {srv.broker_port, srv.web_port}:
        broker_tls, web_tls = _free_port(), _free_port()
    toml = ("[log]\nlevel = %s\n[tls]\nenabled = true\ncert_file = %s\nkey_file = %s\n"
            "broker_port_tls = %d\nweb_port_tls = %d\ncert_refresh_check_seconds = %d\n"
            "plain_ports_enabled = %s\n"
            % (json.dumps(log_level), json.dumps(cert["cert"]), json.dumps(cert["key"]),
               broker_tls, web_tls, refresh, "true" if plain else "false"))
    if trust:
        toml += "trust_certs_file = %s\nrequire_trusted_client_cert = %s\n" % (
            json.dumps(trust), "true" if require else "false")
    toml += extra_toml
    config = os.path.join(srv._tmp, "tls.toml")
    with open(config, "w") as f:
        f.write(toml)
    srv.cmd += ["--config", config]
    srv.tls_service_url = "pulsar+ssl://127.0.0.1:%d" % broker_tls
    srv.tls_web_url = "https://127.0.0.1:%d" % web_tls
    srv.broker_port_tls, srv.web_port_tls = broker_tls, web_tls
    if not plain:
        srv.wait_ready = lambda: _wait_tls_ready(srv, broker_tls, web_tls)
    try:
        srv.start()
        yield srv
    except BaseException:
        print(srv.log_tail())
        raise
    finally:
        srv.close()
        shutil.rmtree(srv._tmp, ignore_errors=True)


def _wait_tls_ready(srv, broker_tls, web_tls):
    """Start-up of a TLS-only broker: both TLS ports accept TCP (no plain port to poll)."""
    deadline = time.monotonic() + srv.start_timeout
    last = None
    while time.monotonic() < deadline:
        if srv.proc.poll() is not None:
            raise RuntimeError("server exited during start-up\n" + srv.log_tail())
        try:
            for port in (broker_tls, web_tls):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError as e:
            last = e
        time.sleep(0.1)  # polling process start-up: there is no event to wait on
    raise RuntimeError("TLS ports not open (%r)\n%s" % (last, srv.log_tail()))


def tls_client(url, ca, validate_hostname=False, auth=None):
    return pulsar.Client(url, tls_trust_certs_file_path=ca, tls_validate_hostname=validate_hostname,
                         authentication=auth, operation_timeout_seconds=8,
                         connection_timeout_ms=4000)


def round_trip(client, n=5):
    """Produces n messages and consumes them on a new topic; returns what came back."""
    topic = unique_topic("tls")
    consumer = client.subscribe(topic, "s")
    producer = client.create_producer(topic)
    sent = [("m-%d" % i).encode() for i in range(n)]
    for body in sent:
        producer.send(body)
    got = []
    for _ in sent:
        msg = consumer.receive(timeout_millis=10000)
        got.append(msg.data())
        consumer.acknowledge(msg)
    assert got == sent
    return got


def refused(client):
    """True when creating a producer fails (the TLS connection was refused)."""
    try:
        client.create_producer(unique_topic("refused"))
    except pulsar.PulsarException:
        return True
    return False


def test_tls_produce_consume_with_hostname_verification(certs):
    ca = certs.ca_main["cert"]
    with tls_server(certs.server) as srv:
        for validate in (True, False):
            client = tls_client(srv.tls_service_url, ca, validate_hostname=validate)
            try:
                round_trip(client)
            finally:
                client.close()
        # The plain port still serves (plain_ports_enabled defaults to true).
        plain = srv.client()
        try:
            round_trip(plain, n=1)
        finally:
            plain.close()


def test_hostname_mismatch_works_only_without_verification(certs):
    ca = certs.ca_main["cert"]
    wrong = certs.leaf(certs.ca_main, "wrong.example", san="DNS:wrong.example")
    with tls_server(wrong) as srv:
        strict = tls_client(srv.tls_service_url, ca, validate_hostname=True)
        try:
            assert refused(strict), "a certificate for wrong.example accepted for 127.0.0.1"
        finally:
            strict.close()
        lax = tls_client(srv.tls_service_url, ca, validate_hostname=False)
        try:
            round_trip(lax)
        finally:
            lax.close()


def test_untrusted_server_certificate_refused(certs):
    stranger = certs.leaf(certs.ca_other, "localhost")
    with tls_server(stranger) as srv:
        client = tls_client(srv.tls_service_url, certs.ca_main["cert"])
        try:
            assert refused(client), "a server certificate of an untrusted CA was accepted"
        finally:
            client.close()


def test_mutual_tls(certs):
    ca = certs.ca_main["cert"]
    mallory = certs.leaf(certs.ca_other, "mallory")
    with tls_server(certs.server, trust=ca, require=True,
                    log_level="info,magnetar_broker::connection=debug") as srv:
        alice = tls_client(srv.tls_service_url, ca,
                           auth=pulsar.AuthenticationTLS(certs.alice["cert"], certs.alice["key"]))
        try:
            round_trip(alice)
        finally:
            alice.close()
        with open(srv.log_path, encoding="utf-8", errors="replace") as f:
            log = f.read()
        assert re.search(r"client_cert_cn=\"?alice\"?.*TLS handshake done|"
                         r"TLS handshake done.*client_cert_cn=\"?alice", log), \
            "the broker did not see the client certificate's CN\n" + log[-3000:]
        for auth in (None, pulsar.AuthenticationTLS(mallory["cert"], mallory["key"])):
            client = tls_client(srv.tls_service_url, ca, auth=auth)
            try:
                assert refused(client), "admitted without a trusted client certificate"
            finally:
                client.close()
        # HTTPS admin: the same requirement.
        status, _ = https_get(srv.tls_web_url + "/admin/v2/tenants", ca, client=certs.alice)
        assert status == 200
        with pytest.raises(REFUSED_HTTPS):
            https_get(srv.tls_web_url + "/admin/v2/tenants", ca)


def test_version_1_client_certificates_are_accepted_and_refusals_logged(certs):
    # The Python client's test certificates, and many an older internal CA's, are X.509 v1
    # (no extensions): Pulsar's Java stack accepts them with the same chain and signature
    # checks; so does Magnetar. A v1 certificate from a CA the broker does not trust is still
    # refused, and each refused handshake is logged at WARN with the peer and the reason.
    ca = certs.ca_main["cert"]
    bob = certs.leaf_v1(certs.ca_main, "bob")
    eve = certs.leaf_v1(certs.ca_other, "eve")
    with tls_server(certs.server, trust=ca, require=True) as srv:
        client = tls_client(srv.tls_service_url, ca,
                            auth=pulsar.AuthenticationTLS(bob["cert"], bob["key"]))
        try:
            round_trip(client)
        finally:
            client.close()
        status, _ = https_get(srv.tls_web_url + "/admin/v2/tenants", ca, client=bob)
        assert status == 200
        stranger = tls_client(srv.tls_service_url, ca,
                              auth=pulsar.AuthenticationTLS(eve["cert"], eve["key"]))
        try:
            assert refused(stranger), "a v1 certificate of an untrusted CA was admitted"
        finally:
            stranger.close()
        with open(srv.log_path, encoding="utf-8", errors="replace") as f:
            log = f.read()
        assert re.search(r"WARN.*TLS handshake failed.*peer=.*(UnknownIssuer|unknown issuer)",
                         log, re.I), log[-3000:]


def test_optional_client_certificate(certs):
    """With a trust store but no requirement: no certificate is admitted, an untrusted one is
    not."""
    ca = certs.ca_main["cert"]
    mallory = certs.leaf(certs.ca_other, "mallory")
    with tls_server(certs.server, trust=ca, require=False) as srv:
        anonymous = tls_client(srv.tls_service_url, ca)
        try:
            round_trip(anonymous, n=1)
        finally:
            anonymous.close()
        client = tls_client(srv.tls_service_url, ca,
                            auth=pulsar.AuthenticationTLS(mallory["cert"], mallory["key"]))
        try:
            assert refused(client), "an untrusted client certificate was admitted"
        finally:
            client.close()


def test_https_admin_and_advertised_tls_urls(certs):
    ca = certs.ca_main["cert"]
    with tls_server(certs.server) as srv:
        status, body = https_get(srv.tls_web_url + "/admin/v2/clusters/standalone", ca)
        assert status == 200
        cluster = json.loads(body)
        assert cluster["brokerServiceUrlTls"] == srv.tls_service_url
        assert cluster["serviceUrlTls"] == srv.tls_web_url
        assert cluster["brokerServiceUrl"] == srv.service_url
        status, body = https_get(
            srv.tls_web_url + "/lookup/v2/topic/persistent/public/default/tls-lookup", ca)
        assert status == 200
        assert json.loads(body)["brokerUrlTls"] == srv.tls_service_url
        # Plain HTTP still answers on the plain port; HTTPS on it does not.
        with urllib.request.urlopen(srv.web_url + "/admin/v2/tenants", timeout=5) as r:
            assert r.status == 200
        with pytest.raises(REFUSED_HTTPS):
            https_get("https://127.0.0.1:%d/admin/v2/tenants" % srv.web_port, ca)


def test_plain_ports_off(certs):
    ca = certs.ca_main["cert"]
    with tls_server(certs.server, plain=False) as srv:
        for port in (srv.broker_port, srv.web_port):
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
        plain = pulsar.Client(srv.service_url, operation_timeout_seconds=5,
                              connection_timeout_ms=2000)
        try:
            assert refused(plain), "the plain port served with plain_ports_enabled = false"
        finally:
            plain.close()
        client = tls_client(srv.tls_service_url, ca, validate_hostname=True)
        try:
            round_trip(client)
        finally:
            client.close()
        status, body = https_get(srv.tls_web_url + "/admin/v2/clusters/standalone", ca)
        assert status == 200
        assert json.loads(body)["brokerServiceUrl"] == srv.tls_service_url


def _replace(path, source):
    """Replaces `path` by a copy of `source` atomically (as an operator's renewal would)."""
    tmp = path + ".new"
    shutil.copyfile(source, tmp)
    os.replace(tmp, path)


def test_certificate_reload(certs, tmp_path):
    ca = certs.ca_main["cert"]
    live = {"cert": str(tmp_path / "server.pem"), "key": str(tmp_path / "server.key")}
    shutil.copyfile(certs.server["cert"], live["cert"])
    shutil.copyfile(certs.server["key"], live["key"])
    renewed = certs.leaf(certs.ca_main, "localhost-renewed")
    with tls_server(live, refresh=1) as srv:
        assert served_common_name(srv.broker_port_tls, ca) == "localhost"
        _replace(live["key"], renewed["key"])
        _replace(live["cert"], renewed["cert"])
        deadline = time.monotonic() + 15
        seen = None
        while time.monotonic() < deadline:
            seen = served_common_name(srv.broker_port_tls, ca)
            if seen == "localhost-renewed":
                break
            time.sleep(0.2)  # polling: the refresh is checked when a connection comes
        assert seen == "localhost-renewed", "the new certificate was not served within 15 s"
        assert served_common_name(srv.web_port_tls, ca) == "localhost-renewed"
        client = tls_client(srv.tls_service_url, ca, validate_hostname=True)
        try:
            round_trip(client, n=2)
        finally:
            client.close()


def test_garbage_and_stalled_handshakes_leave_others_alone(certs):
    ca = certs.ca_main["cert"]
    with tls_server(certs.server) as srv:
        stalled = socket.create_connection(("127.0.0.1", srv.broker_port_tls), timeout=5)
        stalled_started = time.monotonic()
        garbage = socket.create_connection(("127.0.0.1", srv.broker_port_tls), timeout=5)
        garbage.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + os.urandom(512))
        try:
            # The garbage connection is closed (an alert, then EOF) without waiting.
            garbage.settimeout(5)
            try:
                while garbage.recv(4096):
                    pass
            except ConnectionResetError:
                pass  # closed with our garbage unread: a reset instead of EOF
            # Others are served while the stalled one is still open.
            client = tls_client(srv.tls_service_url, ca)
            try:
                round_trip(client)
            finally:
                client.close()
            # The stalled handshake is dropped after the broker's bound.
            stalled.settimeout(HANDSHAKE_TIMEOUT_S + 10)
            assert stalled.recv(1) == b"", "the stalled handshake was not closed"
            assert time.monotonic() - stalled_started >= HANDSHAKE_TIMEOUT_S - 1
        finally:
            stalled.close()
            garbage.close()
        # The broker is still well: a new TLS client works.
        client = tls_client(srv.tls_service_url, ca)
        try:
            round_trip(client, n=1)
        finally:
            client.close()


def test_magnetar_perf_over_tls(certs):
    """Our Rust client (`magnetar perf`, what bench/tls.sh runs) over pulsar+ssl://: it follows
    the lookup's TLS URL and verifies the server's certificate and name."""
    import subprocess
    ca = certs.ca_main["cert"]
    with tls_server(certs.server, plain=False) as srv:
        cmd = [conftest.magnetar_binary(), "perf", "produce", "-u", srv.tls_service_url,
               "--tls-trust-certs-file", ca, "-m", "200", "-s", "128", "--json",
               unique_topic("perf-tls")]
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=60)
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")
        stream = json.loads(proc.stdout)["streams"][0]
        assert stream["messages"] == 200 and stream["errors"] == 0, stream
        # A CA that did not sign the server's certificate: refused.
        cmd[cmd.index(ca)] = certs.ca_other["cert"]
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=60)
        assert proc.returncode != 0, "perf connected with an untrusted server certificate"
