"""Authentication with the official Python client (and Apache's pulsar-admin): HS256 and RS256
tokens whose keys and tokens `magnetar tokens` made, refused tokens (expired, wrong key,
tampered, truncated) answered with AuthenticationError, a producer and consumer that keep
working across token refreshes (AUTH_CHALLENGE every second), basic auth, the anonymous role,
the admin API's 401 and the failure counters on /metrics.

A refused CONNECT is checked on the wire (ERROR AuthenticationError, then close): the C++ client
under the Python one closes on any frame but CONNECTED during its handshake and retries, so it
reports a timeout, exactly as it does against Apache Pulsar."""

import json
import os
import re
import tempfile
import threading
import time

import pulsar
import pytest

import conftest
import pulsar_wire as wire
from auth_util import Keys, bearer, expired_hs, hs256, magnetar
from compat_util import http_request, unique_topic

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("MAGNETAR_TEST_SERVICE_URL") or os.environ.get("MAGNETAR_TEST_SERVER_CMD")),
    reason="starts brokers of its own with authentication on")

OP_TIMEOUT_S = 10


@pytest.fixture(scope="module")
def keys():
    with tempfile.TemporaryDirectory(prefix="magnetar-auth-") as directory:
        yield Keys(directory)


def client(srv, auth):
    return pulsar.Client(srv.service_url, authentication=auth, operation_timeout_seconds=OP_TIMEOUT_S)


def round_trip(c, n=5):
    topic = unique_topic("auth")
    consumer = c.subscribe(topic, "s")
    producer = c.create_producer(topic)
    for i in range(n):
        producer.send(("m%d" % i).encode())
    got = [consumer.receive(timeout_millis=10000).data() for _ in range(n)]
    assert got == [("m%d" % i).encode() for i in range(n)]


def refused(srv, token, why):
    """The broker refuses CONNECT with `token`: ERROR AuthenticationError naming `why`, then it
    closes the connection (checked on the wire: the C++ client under pulsar.Client does not
    surface a CONNECT-time ERROR, for Pulsar either; it retries until its operation timeout)."""
    with wire.RawConnection(srv.service_url) as conn:
        body = (wire.f_bytes(1, "test") + wire.f_varint(4, 21) + wire.f_bytes(3, token.encode())
                + wire.f_bytes(5, "token"))
        conn.send(wire.simple_frame(wire.base_command(wire.CONNECT, 2, body)))
        type_, fields = conn.error_or_close()
    assert type_ == wire.ERROR, "no ERROR before the close"
    assert fields[2][0] == 3, fields  # ServerError.AuthenticationError
    message = fields[3][0].decode()
    assert message.startswith("Unable to authenticate") and why in message, message
    assert token not in message


def client_refused(srv, auth):
    """The official client cannot create a producer (a timeout or an error, as with Pulsar)."""
    c = pulsar.Client(srv.service_url, authentication=auth, operation_timeout_seconds=3)
    try:
        with pytest.raises((pulsar.AuthenticationError, pulsar.Timeout, pulsar.ConnectError)):
            c.create_producer(unique_topic("refused"))
    finally:
        c.close()


def test_hs256_token_produce_consume_and_refusals(keys):
    with conftest.private_server(keys.secret_toml(),
                                 health_headers=bearer(keys.hs_token("admin"))) as srv:
        c = client(srv, pulsar.AuthenticationToken(keys.hs_token("alice", "1h")))
        round_trip(c)
        c.close()
        good = keys.hs_token("alice")
        refused(srv, expired_hs(keys.secret), "token expired")
        refused(srv, hs256(b"another secret of thirty-two byt", {"sub": "alice"}), "signature")
        head, body, sig = good.split(".")
        forged_body = hs256(keys.secret, {"sub": "admin"}).split(".")[1]
        refused(srv, "%s.%s.%s" % (head, forged_body, sig), "signature")  # tampered claims
        refused(srv, good[:-6], "signature")  # truncated signature
        refused(srv, good[:20], "malformed")  # truncated token
        client_refused(srv, pulsar.AuthenticationToken(expired_hs(keys.secret)))
        # No credentials at all, and no anonymous role.
        client_refused(srv, None)
        # Each refusal is counted with its reason; the log says why, without the token.
        _, text = http_request("GET", srv.web_url + "/metrics")
        text = text.decode()
        assert re.search(r'pulsar_authentication_failures_total\{[^}]*auth_method="token"'
                         r'[^}]*reason="EXPIRED_TOKEN"\} [1-9]', text), text[-3000:]
        assert re.search(r'pulsar_authentication_success_total\{[^}]*auth_method="token"\} \d',
                         text)
        assert re.search(r'pulsar_expired_token_total\{cluster="standalone"\} [1-9]', text), text
        log = srv.log_tail(400)
        assert "token expired" in log
        assert good not in log and "panicked" not in log


def test_magnetar_perf_with_a_token(keys):
    """`magnetar perf produce --auth-token` (bench/auth.sh uses it) publishes to a broker with
    authentication on; without the token it is refused."""
    import subprocess
    with conftest.private_server(keys.secret_toml(),
                                 health_headers=bearer(keys.hs_token("admin"))) as srv:
        base = [conftest.magnetar_binary(), "perf", "produce", "-u", srv.service_url, "-m", "3",
                "--json"]
        ok = subprocess.run(base + ["--auth-token", keys.hs_token("perf"), unique_topic("perf")],
                            capture_output=True, timeout=60)
        assert ok.returncode == 0, ok.stderr[-2000:]
        refused = subprocess.run(base + [unique_topic("perf")], capture_output=True, timeout=60)
        assert refused.returncode != 0
        assert b"Unable to authenticate" in refused.stderr, refused.stderr[-2000:]


def test_magnetar_perf_answers_challenges_with_a_rotated_token_file(keys):
    """`magnetar perf produce --auth-token-file`: tokens live 2 s, the broker checks every
    second and challenges an expired one, and this test rotates the file every 0.5 s. Our
    client announces that it can refresh, answers each AUTH_CHALLENGE with the file's current
    token on the same connection, and every message is acknowledged; the broker closed no
    connection for expired credentials and counted the refreshes as successful logins."""
    import subprocess
    token_file = os.path.join(keys.dir, "rotated-token")

    def write_token():
        fresh = keys.hs_token("perf", "2s")
        with open(token_file + ".tmp", "w") as f:
            f.write(fresh + "\n")
        os.replace(token_file + ".tmp", token_file)  # never half written

    def logins(srv):
        _, text = http_request("GET", srv.web_url + "/metrics",
                               headers=bearer(keys.hs_token("admin")))
        found = re.findall(rb'pulsar_authentication_success_total\{[^}]*auth_method="token"[^}]*\}'
                           rb' (\d+)', text)
        return sum(int(n) for n in found)

    write_token()
    stop = threading.Event()

    def rotate():
        while not stop.wait(0.5):
            write_token()

    extra = "refresh_check_seconds = 1\n"
    with conftest.private_server(keys.secret_toml(extra),
                                 health_headers=bearer(keys.hs_token("admin"))) as srv:
        before = logins(srv)
        rotator = threading.Thread(target=rotate, daemon=True)
        rotator.start()
        try:
            done = subprocess.run([conftest.magnetar_binary(), "perf", "produce", "-u",
                                   srv.service_url, "-m", "1000", "-r", "200", "--json",
                                   "--auth-token-file", token_file, unique_topic("perf-rotated")],
                                  capture_output=True, timeout=60)
        finally:
            stop.set()
            rotator.join(timeout=10)
        assert done.returncode == 0, done.stderr[-2000:]
        publish = json.loads(done.stdout)["streams"][0]
        assert (publish["messages"], publish["errors"]) == (1000, 0), done.stdout
        log = srv.log_tail(400)
        assert "credentials expired" not in log, log
        assert "refresh timed out" not in log and "authentication refresh failed" not in log, log
        # 5 s of 2-second tokens checked every second: at least two challenges answered.
        assert logins(srv) - before >= 3, "one connect and at least two refreshes"


def test_rs256_token_from_magnetar_key_pair(keys):
    with conftest.private_server(keys.public_toml(),
                                 health_headers=bearer(keys.rs_token("admin"))) as srv:
        c = client(srv, pulsar.AuthenticationToken(keys.rs_token("carol", "1h")))
        round_trip(c)
        c.close()
        # An HS256 token signed with the public key's bytes (key confusion) is refused.
        with open(keys.public_path, "rb") as f:
            public = f.read()
        refused(srv, hs256(public, {"sub": "admin"}), "algorithm HS256")
        refused(srv, keys.hs_token("carol"), "algorithm HS256")
        # `magnetar tokens validate` agrees.
        token = keys.rs_token("dave")
        out = magnetar("tokens", "validate", "--public-key", "file://" + keys.public_path, token)
        assert b'"sub":"dave"' in out


def test_producer_and_consumer_keep_working_across_token_refreshes(keys):
    """Tokens live 3 s; the broker checks every second and challenges an expired one; the
    client's supplier hands a fresh token each time. The same connection carries on: messages
    sent before, during and after several refreshes all arrive, and no connection was closed
    for authentication."""
    calls = []
    lock = threading.Lock()

    def supplier():
        with lock:
            calls.append(time.monotonic())
        return keys.hs_token("refresher", "3s")

    extra = "refresh_check_seconds = 1\n"
    with conftest.private_server(keys.secret_toml(extra),
                                 health_headers=bearer(keys.hs_token("admin"))) as srv:
        c = client(srv, pulsar.AuthenticationToken(supplier))
        topic = unique_topic("refresh")
        consumer = c.subscribe(topic, "s")
        producer = c.create_producer(topic)
        sent = 0
        deadline = time.monotonic() + 30
        # Until the supplier was asked at least 3 more times (3 refreshes), plus a margin.
        while time.monotonic() < deadline:
            producer.send(("m%d" % sent).encode())
            sent += 1
            msg = consumer.receive(timeout_millis=10000)
            assert msg.data() == ("m%d" % (sent - 1)).encode()
            consumer.acknowledge(msg)
            with lock:
                if len(calls) >= 5:
                    break
            time.sleep(0.2)  # paces the sends over several token lifetimes (not synchronisation)
        with lock:
            assert len(calls) >= 5, "the supplier was asked %d times in 30 s" % len(calls)
        c.close()
        log = srv.log_tail(400)
        assert "refresh timed out" not in log and "authentication refresh failed" not in log
        assert "panicked" not in log
        _, text = http_request("GET", srv.web_url + "/metrics")
        assert b'reason="EXPIRED_TOKEN"' not in text


def test_basic_auth_and_anonymous_role(keys):
    users = os.path.join(keys.dir, "users.txt")
    # `openssl passwd -apr1 -salt m4gn3tar s3cret` (htpasswd's APR1-MD5, as Pulsar reads it)
    hashed = "$apr1$m4gn3tar$cwRBDqyNOmugQqvomiCsA."
    with open(users, "w") as f:
        f.write("bob:%s\n" % hashed)
    toml = ('[authentication]\nenabled = true\nproviders = ["basic", "token"]\n'
            'basic_users_file = "%s"\ntoken_secret_key = "file://%s"\n'
            'anonymous_user_role = "guest"\n' % (users, keys.secret_path))
    import base64
    basic = {"Authorization": "Basic " + base64.b64encode(b"bob:s3cret").decode()}
    with conftest.private_server(toml, health_headers=basic) as srv:
        c = client(srv, pulsar.AuthenticationBasic("bob", "s3cret"))
        round_trip(c)
        c.close()
        client_refused(srv, pulsar.AuthenticationBasic("bob", "wrong"))
        # No credentials: the anonymous role.
        c = pulsar.Client(srv.service_url, operation_timeout_seconds=OP_TIMEOUT_S)
        round_trip(c, 2)
        c.close()
        # HTTP: Basic works, a wrong password is 401 even with an anonymous role.
        status, _ = http_request("GET", srv.web_url + "/admin/v2/tenants", headers=basic)
        assert status == 200
        wrong = {"Authorization": "Basic " + base64.b64encode(b"bob:nope").decode()}
        status, body = http_request("GET", srv.web_url + "/admin/v2/tenants", headers=wrong)
        assert status == 401 and b"reason" in body
        status, _ = http_request("GET", srv.web_url + "/admin/v2/tenants")
        assert status == 200  # anonymous


def test_admin_api_401_and_open_paths(keys):
    token = keys.hs_token("admin")
    with conftest.private_server(keys.secret_toml(), health_headers=bearer(token)) as srv:
        status, body = http_request("GET", srv.web_url + "/admin/v2/tenants")
        assert status == 401
        import json
        reason = json.loads(body)["reason"]
        assert "no credentials" in reason
        status, body = http_request("GET", srv.web_url + "/admin/v2/tenants",
                                    headers=bearer(expired_hs(keys.secret)))
        assert status == 401 and "expired" in json.loads(body)["reason"]
        status, body = http_request("GET", srv.web_url + "/admin/v2/tenants", headers=bearer(token))
        assert status == 200 and b"public" in body
        # Left open as in Pulsar: /metrics and the console's static files; its data is not.
        assert http_request("GET", srv.web_url + "/metrics")[0] == 200
        assert http_request("GET", srv.web_url + "/console/app.js")[0] == 200
        assert http_request("GET", srv.web_url + "/console/api/history")[0] == 401
        assert http_request("GET", srv.web_url + "/console/api/history",
                            headers=bearer(token))[0] == 200


@pytest.mark.skipif(not __import__("pulsar_admin").pulsar_admin_available(),
                    reason="Maven and a JDK are needed for pulsar-admin")
def test_pulsar_admin_with_a_token(keys):
    from pulsar_admin import PulsarAdmin
    token = keys.hs_token("admin")
    with conftest.private_server(keys.secret_toml(), health_headers=bearer(token)) as srv:
        admin = PulsarAdmin(srv.web_url)
        out = admin("--auth-plugin", "org.apache.pulsar.client.impl.auth.AuthenticationToken",
                    "--auth-params", "token:" + token, "tenants", "list")
        assert "public" in out
        failed = admin.fails("tenants", "list")
        assert "401" in failed or "Unauthorized" in failed or "Authentication" in failed, failed
