"""Tokens and keys interchangeable with Apache Pulsar's:

- Apache's own `pulsar tokens` (org.apache.pulsar.utils.auth.tokens.TokensCliUtils 4.0.8, from
  the pulsar-broker jar taken without the broker's dependency tree: tests/pulsar-tokens/pom.xml,
  24 MB) makes secret keys, key pairs and tokens that `magnetar tokens validate` and a broker
  accept, validates the tokens `magnetar tokens create` makes with our keys, and signs with our
  private key;
- jjwt (the library under Pulsar's AuthTokenUtils and AuthenticationProviderToken) driven as
  Pulsar drives it (tests/token-interop/TokenInterop.java) adds ES256 both ways and a refusal."""

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


PULSAR_TOKENS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pulsar-tokens")


def resolve(directory):
    """The classpath of the Maven project in `directory`, resolved once and cached."""
    cached = os.path.join(directory, "classpath.txt")
    if not os.path.exists(cached):
        cmd = ["mvn", "-B", "-ntp", "-q", "-Dstyle.color=never",
               "-Dmaven.repo.local=" + os.path.join(directory, ".m2"),
               "dependency:build-classpath", "-Dmdep.outputFile=" + cached + ".tmp"]
        proc = subprocess.run(cmd, cwd=directory, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=RESOLVE_TIMEOUT_S)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        os.replace(cached + ".tmp", cached)
    with open(cached) as f:
        return f.read().strip()


def pulsar_tokens(*args):
    """Apache's `pulsar tokens ARGS`; returns stdout, asserts exit 0."""
    cmd = ["java", "-cp", resolve(PULSAR_TOKENS_DIR),
           "org.apache.pulsar.utils.auth.tokens.TokensCliUtils"] + [str(a) for a in args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=JAVA_TIMEOUT_S)
    assert proc.returncode == 0, "pulsar tokens %s: %s%s" % (args[0], proc.stdout[-2000:],
                                                             proc.stderr[-3000:])
    return proc.stdout.strip()


def test_apache_pulsar_tokens_and_magnetar_tokens_interoperate(tmp):
    secret = os.path.join(tmp, "p-secret.key")
    private, public = os.path.join(tmp, "p-private.key"), os.path.join(tmp, "p-public.key")
    pulsar_tokens("create-secret-key", "--output", secret)
    pulsar_tokens("create-key-pair", "--output-private-key", private, "--output-public-key", public)
    hs = pulsar_tokens("create", "--secret-key", "file://" + secret, "--subject", "p-hs",
                       "--expiry-time", "1h")
    rs = pulsar_tokens("create", "--private-key", "file://" + private, "--subject", "p-rs")
    # Pulsar's tokens, checked with Pulsar's keys, by us.
    assert b'"sub":"p-hs"' in magnetar("tokens", "validate", "--secret-key", "file://" + secret, hs)
    assert b'"sub":"p-rs"' in magnetar("tokens", "validate", "--public-key", "file://" + public, rs)
    # Our tokens, with Pulsar's secret key and with our key pair, checked by Pulsar.
    ours = magnetar("tokens", "create", "--secret-key", "file://" + secret,
                    "--subject", "m-hs").decode().strip()
    assert "sub=m-hs" in pulsar_tokens("validate", "--secret-key", "file://" + secret, ours)
    m_private, m_public = os.path.join(tmp, "mp-private.key"), os.path.join(tmp, "mp-public.key")
    magnetar("tokens", "create-key-pair", "--output-private-key", m_private,
             "--output-public-key", m_public)
    ours_rs = magnetar("tokens", "create", "--private-key", "file://" + m_private,
                       "--subject", "m-rs").decode().strip()
    assert "sub=m-rs" in pulsar_tokens("validate", "--public-key", "file://" + m_public, ours_rs)
    # Pulsar signs with our private key; we check it with our public key.
    theirs = pulsar_tokens("create", "--private-key", "file://" + m_private, "--subject", "p-m")
    assert b'"sub":"p-m"' in magnetar("tokens", "validate", "--public-key", "file://" + m_public,
                                      theirs)
    # A broker with Pulsar's secret key serves a client holding Pulsar's token.
    toml = '[authentication]\nenabled = true\ntoken_secret_key = "file://%s"\n' % secret
    with conftest.private_server(toml, health_headers=bearer(hs)) as srv:
        c = pulsar.Client(srv.service_url, authentication=pulsar.AuthenticationToken(hs),
                          operation_timeout_seconds=10)
        topic = unique_topic("pulsar-tokens")
        consumer = c.subscribe(topic, "s")
        c.create_producer(topic).send(b"from a pulsar tokens token")
        assert consumer.receive(timeout_millis=10000).data() == b"from a pulsar tokens token"
        c.close()


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
