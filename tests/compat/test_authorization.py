"""Authorization end to end (issue 17): a broker with token authentication and authorization,
driven by the official Python client and the admin REST API with HS256 tokens.

- a role with only `consume` cannot produce;
- a role of tenant A can do nothing in tenant B (produce, consume, lookup, list topics, admin
  reads: AuthorizationError / 403);
- a super-user can do everything;
- revoking a permission closes an open producer within a second, and the producer ends up
  failing (not retrying silently forever).

Tokens are made here with the standard library (HS256 is an HMAC over two base64url parts), so
the suite needs no JWT package.
"""

import base64
import contextlib
import hashlib
import hmac
import json
import os
import re
import shutil
import tempfile
import time

import pulsar
import pytest

import conftest

SECRET = b"magnetar-authorization-test-secret-0123456789abcdef"
SUPER = "root"


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def token(role):
    """An HS256 JWT with `sub` = role (no expiry)."""
    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    payload = b64url(json.dumps({"sub": role}).encode())
    signing_input = ("%s.%s" % (header, payload)).encode()
    signature = b64url(hmac.new(SECRET, signing_input, hashlib.sha256).digest())
    return "%s.%s.%s" % (header, payload, signature)


@contextlib.contextmanager
def secured_server():
    """A broker of the test's own with token authentication and authorization on."""
    with tempfile.TemporaryDirectory(prefix="magnetar-authz-") as directory:
        secret = os.path.join(directory, "secret.key")
        with open(secret, "wb") as f:
            f.write(SECRET)
        toml = ('[authentication]\nenabled = true\nproviders = ["token"]\n'
                'token_secret_key = "file://%s"\n\n'
                '[authorization]\nenabled = true\nsuper_user_roles = ["%s"]\n' % (secret, SUPER))
        # The start-up health check is a super-user operation.
        health = {"Authorization": "Bearer " + token(SUPER)}
        with conftest.private_server(toml, health_headers=health) as srv:
            yield srv


def admin(srv, method, path, body=None, role=SUPER):
    """One admin request as `role`; returns (status, parsed JSON or text)."""
    import urllib.error
    import urllib.request
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(srv.web_url + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if role is not None:
        req.add_header("Authorization", "Bearer " + token(role))
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode("utf-8", "replace")


def client(srv, role):
    return pulsar.Client(srv.service_url, authentication=pulsar.AuthenticationToken(token(role)),
                         operation_timeout_seconds=10)


def setup_tenants(srv):
    """Tenants `ta` (admin `admin-a`) and `tb` (admin `admin-b`), namespace `ns` in each."""
    for tenant, role in (("ta", "admin-a"), ("tb", "admin-b")):
        status, body = admin(srv, "PUT", "/admin/v2/tenants/" + tenant,
                             {"adminRoles": [role], "allowedClusters": ["standalone"]})
        assert status == 204, (status, body)
        status, body = admin(srv, "PUT", "/admin/v2/namespaces/%s/ns" % tenant)
        assert status == 204, (status, body)


def grant(srv, namespace, role, actions):
    status, body = admin(srv, "POST", "/admin/v2/namespaces/%s/permissions/%s" % (namespace, role),
                         actions)
    assert status == 204, (status, body)


def test_consume_only_role_cannot_produce_but_can_consume():
    with secured_server() as srv:
        setup_tenants(srv)
        grant(srv, "ta/ns", "reader", ["consume"])
        topic = "persistent://ta/ns/orders"
        c = client(srv, "reader")
        try:
            with pytest.raises(pulsar.AuthorizationError):
                c.create_producer(topic)
            consumer = c.subscribe(topic, "sub")
            consumer.close()
        finally:
            c.close()


def test_a_role_of_tenant_a_can_do_nothing_in_tenant_b():
    with secured_server() as srv:
        setup_tenants(srv)
        c = client(srv, "admin-a")
        try:
            # In its own tenant: everything (a tenant admin).
            p = c.create_producer("persistent://ta/ns/t")
            p.send(b"mine")
            p.close()
            other = "persistent://tb/ns/t"
            with pytest.raises(pulsar.AuthorizationError):
                c.create_producer(other)
            with pytest.raises(pulsar.AuthorizationError):
                c.subscribe(other, "s")
            with pytest.raises(pulsar.AuthorizationError):
                c.get_topic_partitions(other)  # PARTITIONED_METADATA / LOOKUP
            with pytest.raises(Exception):  # GET_TOPICS_OF_NAMESPACE is refused
                c.subscribe(re.compile("persistent://tb/ns/.*"), "s",
                            pattern_auto_discovery_period=1)
        finally:
            c.close()
        for path in ("/admin/v2/namespaces/tb/ns/topics", "/admin/v2/persistent/tb/ns",
                     "/admin/v2/namespaces/tb", "/admin/v2/namespaces/tb/ns",
                     "/admin/v2/persistent/tb/ns/t/stats", "/admin/v2/tenants/tb"):
            status, body = admin(srv, "GET", path, role="admin-a")
            assert status == 403, (path, status, body)
            assert body.get("reason"), body
        status, _ = admin(srv, "GET", "/admin/v2/namespaces/ta/ns/topics", role="admin-a")
        assert status == 200


def test_a_super_user_can_do_everything():
    with secured_server() as srv:
        setup_tenants(srv)
        c = client(srv, SUPER)
        try:
            for tenant in ("ta", "tb"):
                topic = "persistent://%s/ns/t" % tenant
                consumer = c.subscribe(topic, "s")
                p = c.create_producer(topic)
                p.send(b"hello")
                msg = consumer.receive(timeout_millis=10000)
                assert msg.data() == b"hello"
                consumer.acknowledge(msg)
                p.close()
                consumer.close()
        finally:
            c.close()
        status, body = admin(srv, "GET", "/admin/v2/tenants")
        assert status == 200 and "ta" in body and "tb" in body
        # Nobody else lists tenants.
        status, _ = admin(srv, "GET", "/admin/v2/tenants", role="admin-a")
        assert status == 403


def test_revoking_a_permission_cuts_an_open_producer_off():
    with secured_server() as srv:
        setup_tenants(srv)
        grant(srv, "ta/ns", "writer", ["produce"])
        topic = "persistent://ta/ns/live"
        c = client(srv, "writer")
        try:
            p = c.create_producer(topic, send_timeout_millis=3000)
            p.send(b"before")
            status, stats = admin(srv, "GET", "/admin/v2/persistent/ta/ns/live/stats")
            assert status == 200 and len(stats["publishers"]) == 1, stats
            status, body = admin(srv, "DELETE", "/admin/v2/namespaces/ta/ns/permissions/writer")
            assert status == 204, (status, body)
            revoked_at = time.monotonic()
            # The broker closes it within a second (bounded poll of the topic's publishers).
            while True:
                status, stats = admin(srv, "GET", "/admin/v2/persistent/ta/ns/live/stats")
                if status == 200 and not stats["publishers"]:
                    break
                assert time.monotonic() - revoked_at < 1.0, "producer still open: %s" % stats
                time.sleep(0.05)  # polling the broker's view: no event to await from here
            # The client's reconnection is refused: sends fail (within the send timeout).
            started = time.monotonic()
            with pytest.raises(pulsar.PulsarException):
                p.send(b"after")
            assert time.monotonic() - started < 20
            status, stats = admin(srv, "GET", "/admin/v2/persistent/ta/ns/live/stats")
            assert not stats["publishers"], stats
        finally:
            c.close()


def test_topic_level_grants_and_subscription_permissions():
    with secured_server() as srv:
        setup_tenants(srv)
        status, body = admin(srv, "POST", "/admin/v2/persistent/ta/ns/only/permissions/bob",
                             ["produce", "consume"])
        assert status == 204, (status, body)
        c = client(srv, "bob")
        try:
            p = c.create_producer("persistent://ta/ns/only")
            p.close()
            with pytest.raises(pulsar.AuthorizationError):
                c.create_producer("persistent://ta/ns/other")
            # Subscription `locked` is reserved to another role.
            status, body = admin(srv, "POST",
                                 "/admin/v2/namespaces/ta/ns/permissions/subscription/locked",
                                 ["carol"])
            assert status == 204, (status, body)
            with pytest.raises(pulsar.AuthorizationError):
                c.subscribe("persistent://ta/ns/only", "locked")
            c.subscribe("persistent://ta/ns/only", "free").close()
        finally:
            c.close()


GO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "go")


@pytest.mark.skipif(shutil.which("go") is None, reason="the Go toolchain (`go`) is not on PATH")
@pytest.mark.timeout(960)  # a cold run compiles the Go client
def test_go_client_sees_authorization_error():
    import subprocess
    with secured_server() as srv:
        setup_tenants(srv)
        grant(srv, "ta/ns", "reader", ["consume"])
        env = dict(os.environ,
                   MAGNETAR_TEST_SERVICE_URL=srv.service_url,
                   MAGNETAR_TEST_WEB_URL=srv.web_url,
                   MAGNETAR_AUTHZ_READER_TOKEN=token("reader"),
                   MAGNETAR_AUTHZ_TOPIC="persistent://ta/ns/go",
                   MAGNETAR_AUTHZ_OTHER_PATH="/admin/v2/namespaces/tb/ns/topics",
                   GOFLAGS=(os.environ.get("GOFLAGS", "") + " -mod=readonly").strip())
        cmd = ["go", "test", "-count=1", "-v", "-tags", "authz", "-run", "TestAuthz",
               "-timeout", "300s", "./..."]
        proc = subprocess.run(cmd, cwd=GO_DIR, env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)
        out = proc.stdout.decode("utf-8", "replace")
        assert proc.returncode == 0, out[-20000:]
        assert "--- PASS: TestAuthzGoClient" in out, out[-20000:]


def test_pulsar_admin_with_a_token_sees_403():
    from pulsar_admin import PulsarAdmin, pulsar_admin_available
    if not pulsar_admin_available():
        pytest.skip("Maven (`mvn`) and a JDK (`java`) are needed on PATH")
    with secured_server() as srv:
        setup_tenants(srv)

        def cli(role):
            admin_cli = PulsarAdmin(srv.web_url)
            with open(admin_cli.conf, "a") as f:
                f.write("authPlugin=org.apache.pulsar.client.impl.auth.AuthenticationToken\n"
                        "authParams=token:%s\n" % token(role))
            return admin_cli

        tenant_a = cli("admin-a")
        # Its own tenant: grant, list permissions, grant on a topic and a subscription.
        tenant_a("namespaces", "grant-permission", "ta/ns", "--role", "app",
                 "--actions", "produce,consume")
        # (the CLI prints a Java set: its order varies from run to run)
        assert re.search(r"^app\s+\[(consume, produce|produce, consume)\]$",
                         tenant_a("namespaces", "permissions", "ta/ns"), re.M)
        tenant_a("topics", "grant-permission", "persistent://ta/ns/t", "--role", "bob",
                 "--actions", "produce")
        perms = tenant_a("topics", "permissions", "persistent://ta/ns/t")
        assert re.search(r"^bob\s+\[produce\]$", perms, re.M), perms
        assert re.search(r"^app\s+\[(consume, produce|produce, consume)\]$", perms, re.M), perms
        tenant_a("topics", "revoke-permission", "persistent://ta/ns/t", "--role", "bob")
        assert "bob" not in tenant_a("topics", "permissions", "persistent://ta/ns/t")
        tenant_a("namespaces", "grant-subscription-permission", "ta/ns", "--subscription", "s",
                 "--roles", "app")
        tenant_a("namespaces", "revoke-subscription-permission", "ta/ns", "--subscription", "s",
                 "--role", "app")
        # Another tenant: refused (403).
        out = tenant_a.fails("namespaces", "permissions", "tb/ns")
        assert "Reason: admin-a is not authorized" in out, out
        out = tenant_a.fails("topics", "list", "tb/ns")
        assert "Reason: admin-a is not authorized" in out, out
        # Super-user business.
        out = tenant_a.fails("tenants", "create", "tc", "--allowed-clusters", "standalone")
        assert "Reason: admin-a is not a super-user" in out, out
        cli(SUPER)("tenants", "create", "tc", "--allowed-clusters", "standalone")


def test_missing_tenant_is_not_found_before_any_permission_and_subscription_grants_revoke():
    # Pulsar's validateTenantAdminAccess: for a role that is not a super-user, a tenant that does
    # not exist is NOT_FOUND before any permission is looked at: a producer there fails with
    # TopicNotFound (Python asyncio test_create_producer_failure), an admin call with 404
    # "Tenant does not exist" (namespaces set-schema-compatibility-strategy).
    with secured_server() as srv:
        setup_tenants(srv)
        c = client(srv, "nobody")
        try:
            with pytest.raises(pulsar.TopicNotFound):
                c.create_producer("persistent://no-such-tenant/ns/t")
            with pytest.raises(pulsar.AuthorizationError):
                c.create_producer("persistent://ta/ns/t")
        finally:
            c.close()
        status, body = admin(srv, "PUT", "/admin/v2/namespaces/no-such-tenant/ns/schemaCompatibilityStrategy",
                             "FULL", role="nobody")
        assert (status, body) == (404, {"reason": "Tenant does not exist"}), (status, body)
        status, body = admin(srv, "PUT", "/admin/v2/namespaces/ta/ns/schemaCompatibilityStrategy",
                             "FULL", role="nobody")
        assert status == 403, (status, body)

        # Subscription permissions: granted, then revoked through the path pulsar-admin's
        # `namespaces revoke-subscription-permission` uses.
        path = "/admin/v2/namespaces/ta/ns/permissions/subscription"
        status, body = admin(srv, "POST", path + "/locked", ["carol", "dave"])
        assert status == 204, (status, body)
        status, body = admin(srv, "DELETE", path + "/locked/carol")
        assert status == 204, (status, body)
        status, body = admin(srv, "GET", path)
        assert (status, body) == (200, {"locked": ["dave"]}), (status, body)
