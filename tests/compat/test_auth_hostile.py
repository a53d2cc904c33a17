"""Hostile authentication input: raw CONNECT / AUTH_RESPONSE frames and HTTP Authorization
headers built to break the providers (truncated and forged tokens, `alg: none`, key confusion,
oversized and non-UTF-8 data, commands out of order, ...). Each is refused with the right error
(ERROR AuthenticationError then a closed connection, or HTTP 401), nothing panics, and an
authenticated client keeps producing and consuming throughout (checked after every case)."""

import base64
import json
import os
import tempfile
import time

import pulsar
import pytest

import conftest
import pulsar_wire as wire
from auth_util import Keys, b64url, bearer, expired_hs, hs256
from compat_util import http_request, unique_topic

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("MAGNETAR_TEST_SERVICE_URL") or os.environ.get("MAGNETAR_TEST_SERVER_CMD")),
    reason="starts brokers of its own with authentication on")

AUTH_CHALLENGE, AUTH_RESPONSE = 36, 37
AUTHENTICATION_ERROR = 3  # ServerError.AuthenticationError
CLOSED = object()  # the connection closes without an ERROR (an undecodable frame)


def connect_frame(method=None, data=None, refresh=False):
    # CommandConnect: client_version 1, auth_data 3, protocol_version 4, auth_method_name 5,
    # feature_flags 10 (FeatureFlags.supports_auth_refresh 1)
    body = wire.f_bytes(1, "hostile") + wire.f_varint(4, 21)
    if data is not None:
        body += wire.f_bytes(3, data)
    if method is not None:
        body += wire.f_bytes(5, method)
    if refresh:
        body += wire.f_bytes(10, wire.f_varint(1, 1))
    return wire.simple_frame(wire.base_command(wire.CONNECT, 2, body))


def auth_response_frame(method, data):
    # CommandAuthResponse: client_version 1, response 2 (AuthData: method 1, data 2),
    # protocol_version 3
    auth = wire.f_bytes(1, method) + wire.f_bytes(2, data)
    body = wire.f_bytes(1, "hostile") + wire.f_bytes(2, auth) + wire.f_varint(3, 21)
    return wire.simple_frame(wire.base_command(AUTH_RESPONSE, AUTH_RESPONSE, body))


def frames_until_close(conn, timeout=10):
    """Every frame until the broker closes the connection, as (type, fields)."""
    seen = []
    deadline = time.monotonic() + timeout
    while True:
        try:
            seen.append(conn.read_frame(max(0.01, deadline - time.monotonic())))
        except wire.Closed:
            return seen
        except OSError:
            raise AssertionError("connection neither closed in %d s; frames: %r" % (timeout, seen))


def assert_refused(srv, frames, expect_word=None):
    """Sends `frames` on a fresh connection: the broker answers ERROR AuthenticationError (its
    message naming `expect_word`) and closes, never CONNECTED."""
    with wire.RawConnection(srv.service_url) as conn:
        conn.send(b"".join(frames))
        seen = frames_until_close(conn)
    types = [t for t, _ in seen]
    assert wire.CONNECTED not in types, "accepted: %r" % seen
    if expect_word is CLOSED:
        return ""
    errors = [f for t, f in seen if t == wire.ERROR]
    assert errors, "no ERROR before close: %r" % seen
    assert errors[0][2][0] == AUTHENTICATION_ERROR, errors[0]
    message = errors[0][3][0].decode("utf-8", "replace")
    if expect_word:
        assert expect_word in message, message
    return message


class Witness:
    """An authenticated producer and consumer that must keep working."""

    def __init__(self, srv, token):
        self.client = pulsar.Client(srv.service_url, authentication=pulsar.AuthenticationToken(token),
                                    operation_timeout_seconds=10)
        topic = unique_topic("witness")
        self.consumer = self.client.subscribe(topic, "w")
        self.producer = self.client.create_producer(topic)
        self.n = 0

    def check(self):
        self.n += 1
        payload = ("w%d" % self.n).encode()
        self.producer.send(payload)
        assert self.consumer.receive(timeout_millis=10000).data() == payload


@pytest.fixture(scope="module")
def env():
    with tempfile.TemporaryDirectory(prefix="magnetar-hostile-") as directory:
        keys = Keys(directory)
        users = os.path.join(directory, "users.txt")
        hashed = "$apr1$m4gn3tar$TJgrmEnllTveckM2RI2Vx1"  # openssl passwd -apr1 -salt m4gn3tar pw
        with open(users, "w") as f:
            f.write("bob:%s\n" % hashed)
        toml = ('[authentication]\nenabled = true\nproviders = ["token", "basic"]\n'
                'token_secret_key = "file://%s"\nbasic_users_file = "%s"\n'
                'refresh_check_seconds = 1\n' % (keys.secret_path, users))
        admin = keys.hs_token("admin")
        with conftest.private_server(toml, health_headers=bearer(admin)) as srv:
            witness = Witness(srv, keys.hs_token("witness"))
            yield keys, srv, witness
            witness.client.close()
            log = srv.log_tail(5000)
            assert "panicked" not in log, log


def token_cases(keys):
    """(name, method, data, word expected in the refusal)."""
    good = keys.hs_token("alice")
    head, body, sig = good.split(".")
    none_head = b64url(b'{"alg":"none"}')
    claims = b64url(b'{"sub":"admin"}')
    s = keys.secret
    cases = [
        ("no credentials", None, None, "no credentials"),
        ("empty token", "token", b"", "malformed"),
        ("truncated to 1 char", "token", good[:1].encode(), "malformed"),
        ("truncated to the header", "token", (head + ".").encode(), "malformed"),
        ("truncated inside the claims", "token", good[:len(head) + 5].encode(), "malformed"),
        ("truncated signature", "token", good[:-3].encode(), "signature"),
        ("signature removed", "token", (head + "." + body + ".").encode(), "signature"),
        ("alg none", "token", ("%s.%s." % (none_head, claims)).encode(), "algorithm"),
        ("alg NONE with a signature", "token",
         ("%s.%s.%s" % (b64url(b'{"alg":"NONE"}'), claims, sig)).encode(), "algorithm"),
        ("alg RS256 on a secret key", "token",
         ("%s.%s.%s" % (b64url(b'{"alg":"RS256"}'), claims, sig)).encode(), "algorithm"),
        ("HS512 on a 256-bit key", "token",
         ("%s.%s.%s" % (b64url(b'{"alg":"HS512"}'), claims, sig)).encode(), "algorithm"),
        ("tampered claims", "token", ("%s.%s.%s" % (head, claims, sig)).encode(), "signature"),
        ("wrong key", "token", hs256(b"x" * 32, {"sub": "alice"}).encode(), "signature"),
        ("expired", "token", expired_hs(s).encode(), "expired"),
        ("not yet valid", "token", hs256(s, {"sub": "a", "nbf": time.time() + 3600}).encode(),
         "not valid yet"),
        ("exp as a string", "token", hs256(s, {"sub": "a", "exp": "tomorrow"}).encode(), "exp"),
        ("negative exp", "token", hs256(s, {"sub": "a", "exp": -5}).encode(), "exp"),
        ("no sub", "token", hs256(s, {"role": "a"}).encode(), "role"),
        ("empty sub", "token", hs256(s, {"sub": ""}).encode(), "role"),
        ("numeric sub", "token", hs256(s, {"sub": 42}).encode(), "role"),
        ("claims not JSON", "token", ("%s.%s.%s" % (head, b64url(b"not json"), sig)).encode(),
         "signature"),
        ("header not JSON", "token", ("%s.%s.%s" % (b64url(b"[1,2]"), body, sig)).encode(),
         "malformed"),
        ("four parts", "token", (good + ".x").encode(), "malformed"),
        ("not base64", "token", b"@@@.###.$$$", "malformed"),
        ("non-UTF-8 token", "token", b"\xff\xfe\xfd.\x80.\x81", "UTF-8"),
        ("oversized token (1 MiB)", "token", b"a" * (1 << 20), "too large"),
        ("huge claims (60 KiB) with a bad signature", "token",
         ("%s.%s.%s" % (head, b64url(json.dumps({"sub": "a", "pad": "x" * 45000}).encode()),
                        sig)).encode(), "signature"),
        ("unknown method", "kerberos", b"ticket", "unknown authentication method"),
        ("oversized method name", "m" * 100000, b"x", "unknown authentication method"),
        # Not a valid protobuf string: the frame does not decode; the connection just closes.
        ("non-UTF-8 method name", b"\xff\xfe", b"x", CLOSED),
        ("tls method, provider not configured", "tls", b"", "unknown authentication method"),
        ("basic with no colon", "basic", b"bob", "user:password"),
        ("basic with a wrong password", "basic", b"bob:wrong", "wrong password"),
        ("basic non-UTF-8", "basic", b"bob:\xff\xfe", "UTF-8"),
        ("basic unknown user", "basic", b"mallory:pw", "wrong password"),
    ]
    return cases


def test_hostile_connects_are_refused_and_the_witness_keeps_working(env):
    keys, srv, witness = env
    cases = token_cases(keys)
    assert len(cases) >= 30
    for name, method, data, word in cases:
        try:
            message = assert_refused(srv, [connect_frame(method, data)], word)
        except AssertionError as e:
            raise AssertionError("case %r: %s" % (name, e))
        # The refusal never echoes the credential.
        if data and len(data) > 8:
            assert data.decode("utf-8", "replace") not in message, name
        witness.check()


def test_auth_response_out_of_order_is_refused(env):
    keys, srv, witness = env
    token = keys.hs_token("alice").encode()
    # Before CONNECT.
    assert_refused(srv, [auth_response_frame("token", token)], "before CONNECT")
    witness.check()
    # Unsolicited, after a good CONNECT: refused and closed.
    with wire.RawConnection(srv.service_url) as conn:
        conn.send(connect_frame("token", token))
        conn.expect(wire.CONNECTED)
        conn.send(auth_response_frame("token", token))
        seen = frames_until_close(conn)
    assert [f[2][0] for t, f in seen if t == wire.ERROR] == [AUTHENTICATION_ERROR], seen
    witness.check()
    # A second CONNECT with another method right after a failed one: never CONNECTED.
    assert_refused(srv, [connect_frame("token", b"bad.token.here"),
                         connect_frame("basic", b"bob:pw")])
    witness.check()
    # A second CONNECT after a good one closes the connection.
    with wire.RawConnection(srv.service_url) as conn:
        conn.send(connect_frame("token", token))
        conn.expect(wire.CONNECTED)
        conn.send(connect_frame("basic", b"bob:pw"))
        seen = frames_until_close(conn)
    assert wire.CONNECTED not in [t for t, _ in seen]
    witness.check()


def test_expired_token_is_challenged_then_the_connection_closed(env):
    """Checks run every second here. A client whose token expired is sent AUTH_CHALLENGE
    (its method, data `PulsarAuthRefresh`); no answer by the next check: ERROR and close. A
    client that did not announce refresh support is closed without a challenge. A wrong
    answer (another role) closes it too."""
    keys, srv, witness = env

    def short_token(role="shortlived"):
        return hs256(keys.secret, {"sub": role, "exp": int(time.time()) + 1}).encode()

    with wire.RawConnection(srv.service_url) as conn:
        conn.send(connect_frame("token", short_token(), refresh=True))
        conn.expect(wire.CONNECTED)
        challenge = conn.expect(AUTH_CHALLENGE, timeout=10)
        auth = wire.decode_fields(challenge[2][0])  # CommandAuthChallenge.challenge = 2
        assert auth[1][0] == b"token" and auth[2][0] == b"PulsarAuthRefresh", auth
        seen = frames_until_close(conn, timeout=10)
    errors = [f for t, f in seen if t == wire.ERROR]
    assert errors and b"not refreshed" in errors[0][3][0], seen
    witness.check()

    with wire.RawConnection(srv.service_url) as conn:
        conn.send(connect_frame("token", short_token(), refresh=False))
        conn.expect(wire.CONNECTED)
        seen = frames_until_close(conn, timeout=10)
    assert AUTH_CHALLENGE not in [t for t, _ in seen], seen
    witness.check()

    with wire.RawConnection(srv.service_url) as conn:
        conn.send(connect_frame("token", short_token(), refresh=True))
        conn.expect(wire.CONNECTED)
        conn.expect(AUTH_CHALLENGE, timeout=10)
        conn.send(auth_response_frame("token", keys.hs_token("someone-else").encode()))
        seen = frames_until_close(conn, timeout=10)
    errors = [f for t, f in seen if t == wire.ERROR]
    assert errors and b"role changed" in errors[0][3][0], seen
    witness.check()

    # A good answer keeps the connection: it answers a PING afterwards.
    with wire.RawConnection(srv.service_url) as conn:
        conn.send(connect_frame("token", short_token(), refresh=True))
        conn.expect(wire.CONNECTED)
        conn.expect(AUTH_CHALLENGE, timeout=10)
        conn.send(auth_response_frame("token", keys.hs_token("shortlived", "1h").encode()))
        conn.send(wire.simple_frame(wire.base_command(wire.PING, 18, b"")))
        conn.expect(wire.PONG, timeout=10)
    witness.check()


HTTP_CASES = [
    ("no header", None, 401),
    ("empty Bearer", "Bearer ", 401),
    ("Bearer alg none", "Bearer %s.%s." % (b64url(b'{"alg":"none"}'), b64url(b'{"sub":"admin"}')),
     401),
    ("Bearer garbage", "Bearer !!!", 401),
    ("Basic no colon", "Basic " + base64.b64encode(b"bob").decode(), 401),
    ("Basic not base64", "Basic ###", 401),
    ("Basic wrong password", "Basic " + base64.b64encode(b"bob:nope").decode(), 401),
    ("unknown scheme", "Negotiate abc", 401),
    ("huge header (64 KiB)", "Bearer " + "a" * 65536, (401, 431, 400)),
    ("huge header (1 MiB)", "Bearer " + "a" * (1 << 20), (401, 431, 400, "closed")),
]


def test_hostile_http_authorization_is_refused(env):
    keys, srv, witness = env
    for name, header, want in HTTP_CASES:
        headers = {"Authorization": header} if header is not None else None
        try:
            status, body = http_request("GET", srv.web_url + "/admin/v2/tenants", headers=headers)
        except OSError:
            status, body = "closed", b""
        wants = want if isinstance(want, tuple) else (want,)
        assert status in wants, "%s: %s %r" % (name, status, body[:300])
        if status == 401:
            assert "reason" in json.loads(body), name
        witness.check()
    # Non-UTF-8 bytes in the header, over a raw socket.
    import socket
    host, port = srv.web_url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"GET /admin/v2/tenants HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\r\n"
                  b"Connection: close\r\n\r\n")
        reply = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            reply += chunk
    assert reply.split(b" ")[1] in (b"401", b"400"), reply[:200]
    witness.check()
    # And the good token still works.
    status, _ = http_request("GET", srv.web_url + "/admin/v2/tenants",
                             headers=bearer(keys.hs_token("admin")))
    assert status == 200
