"""Tokens and keys interchangeable with Apache Pulsar's: jjwt (the library of Pulsar's
AuthTokenUtils and AuthenticationProviderToken) driven as Pulsar drives it
(tests/token-interop/TokenInterop.java) makes keys and tokens that `magnetar tokens validate`
and a broker accept, and checks the keys and tokens `magnetar tokens` makes.

Why not Apache's own `pulsar tokens`: its TokensCliUtils ships only inside the pulsar-broker
jar, whose dependency tree is the whole broker (BookKeeper, ZooKeeper, Jetty, ...); the few
lines it runs around jjwt (Keys.secretKeyFor / keyPairFor, getEncoded(), Jwts.builder()
.setSubject().signWith(key), a parser with the validation key) are what TokenInterop does."""

import os
import shutil
import subprocess
import tempfile

import pulsar
import pytest

import conftest
from auth_util import bearer, magnetar
from compat_util import unique_topic

INTEROP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "token-interop")
CLASSPATH_FILE = os.path.join(INTEROP_DIR, "classpath.txt")
RESOLVE_TIMEOUT_S = 600
JAVA_TIMEOUT_S = 60

pytestmark = [
    pytest.mark.skipif(shutil.which("mvn") is None or shutil.which("java") is None,
                       reason="Maven (`mvn`) and a JDK (`java`) are needed on PATH"),
    pytest.mark.skipif(
        bool(os.environ.get("MAGNETAR_TEST_SERVICE_URL") or os.environ.get("MAGNETAR_TEST_SERVER_CMD")),
        reason="starts a broker of its own with authentication on"),
]


def classpath():
    if not os.path.exists(CLASSPATH_FILE):
        cmd = ["mvn", "-B", "-ntp", "-q", "-Dstyle.color=never",
               "-Dmaven.repo.local=" + os.path.join(INTEROP_DIR, ".m2"),
               "dependency:build-classpath", "-Dmdep.outputFile=" + CLASSPATH_FILE + ".tmp"]
        proc = subprocess.run(cmd, cwd=INTEROP_DIR, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=RESOLVE_TIMEOUT_S)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        os.replace(CLASSPATH_FILE + ".tmp", CLASSPATH_FILE)
    with open(CLASSPATH_FILE) as f:
        return f.read().strip()


def jjwt(*args):
    cmd = ["java", "-cp", classpath(), os.path.join(INTEROP_DIR, "TokenInterop.java")]
    proc = subprocess.run(cmd + [str(a) for a in args], capture_output=True, text=True,
                          timeout=JAVA_TIMEOUT_S)
    assert proc.returncode == 0, "TokenInterop %s: %s" % (args[0], proc.stderr[-3000:])
    return proc.stdout.strip()


def jjwt_fails(*args):
    cmd = ["java", "-cp", classpath(), os.path.join(INTEROP_DIR, "TokenInterop.java")]
    proc = subprocess.run(cmd + [str(a) for a in args], capture_output=True, text=True,
                          timeout=JAVA_TIMEOUT_S)
    assert proc.returncode != 0, "jjwt accepted %r" % (args,)
    return proc.stderr


@pytest.fixture(scope="module")
def tmp():
    with tempfile.TemporaryDirectory(prefix="magnetar-interop-") as directory:
        yield directory


def test_pulsar_style_keys_and_tokens_are_accepted(tmp):
    secret = os.path.join(tmp, "j-secret.key")
    private, public = os.path.join(tmp, "j-private.key"), os.path.join(tmp, "j-public.key")
    ec_private, ec_public = os.path.join(tmp, "j-ec-private.key"), os.path.join(tmp, "j-ec-public.key")
    jjwt("create-secret-key", secret)
    jjwt("create-key-pair", private, public, "RS256")
    jjwt("create-key-pair", ec_private, ec_public, "ES256")
    hs = jjwt("create", "secret", secret, "RSA", "hs-user", 3600)
    rs = jjwt("create", "private", private, "RSA", "rs-user")
    es = jjwt("create", "private", ec_private, "EC", "es-user")
    assert b'"sub":"hs-user"' in magnetar("tokens", "validate", "--secret-key", "file://" + secret, hs)
    assert b'"sub":"rs-user"' in magnetar("tokens", "validate", "--public-key", "file://" + public, rs)
    assert b'"sub":"es-user"' in magnetar("tokens", "validate", "--public-key", "file://" + ec_public,
                                          "--signature-algorithm", "ES256", es)
    # A broker configured with the Java-made public key serves a client with the Java token.
    toml = '[authentication]\nenabled = true\ntoken_public_key = "file://%s"\n' % public
    with conftest.private_server(toml, health_headers=bearer(rs)) as srv:
        c = pulsar.Client(srv.service_url, authentication=pulsar.AuthenticationToken(rs),
                          operation_timeout_seconds=10)
        topic = unique_topic("interop")
        consumer = c.subscribe(topic, "s")
        c.create_producer(topic).send(b"from a jjwt token")
        assert consumer.receive(timeout_millis=10000).data() == b"from a jjwt token"
        c.close()


def test_magnetar_keys_and_tokens_are_accepted_by_jjwt(tmp):
    secret = os.path.join(tmp, "m-secret.key")
    private, public = os.path.join(tmp, "m-private.key"), os.path.join(tmp, "m-public.key")
    ec_private, ec_public = os.path.join(tmp, "m-ec-private.key"), os.path.join(tmp, "m-ec-public.key")
    magnetar("tokens", "create-secret-key", "--output", secret)
    magnetar("tokens", "create-key-pair", "--output-private-key", private,
             "--output-public-key", public)
    magnetar("tokens", "create-key-pair", "--signature-algorithm", "ES256",
             "--output-private-key", ec_private, "--output-public-key", ec_public)
    hs = magnetar("tokens", "create", "--secret-key", "file://" + secret, "--subject", "m-hs",
                  "--expiry-time", "1h").decode().strip()
    rs = magnetar("tokens", "create", "--private-key", "file://" + private,
                  "--subject", "m-rs").decode().strip()
    es = magnetar("tokens", "create", "--private-key", "file://" + ec_private,
                  "--subject", "m-es").decode().strip()
    assert jjwt("validate", "secret", secret, "RSA", hs) == "m-hs"
    assert jjwt("validate", "public", public, "RSA", rs) == "m-rs"
    assert jjwt("validate", "public", ec_public, "EC", es) == "m-es"
    # jjwt also reads our private keys (PKCS#8) and signs tokens we validate.
    again = jjwt("create", "private", private, "RSA", "j-with-m-key")
    assert b"j-with-m-key" in magnetar("tokens", "validate", "--public-key", "file://" + public, again)
    # And it refuses a token of ours checked with another key.
    other = os.path.join(tmp, "m-other.key")
    magnetar("tokens", "create-secret-key", "--output", other)
    assert "signature" in jjwt_fails("validate", "secret", other, "RSA", hs).lower()
