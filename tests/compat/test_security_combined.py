"""TLS, authentication and authorization together, with the official Python client: the role
of an mTLS client is its certificate's CN (`providers = ["tls"]`) and authorization decides on
it; HS256 and RS256 tokens over `pulsar+ssl://`; the HTTPS admin API takes the same client certificate as the
role (a super-user's certificate grants, another's gets 403). Each part is tested alone in
test_tls.py, test_auth_token.py and test_authorization.py; this checks the seams between them
(the TLS listener fills the identity the providers and the authorizer read)."""

import json
import shutil
import tempfile
import urllib.error
import urllib.request

import pulsar
import pytest

from auth_util import Keys
from compat_util import unique_topic
from test_tls import _ssl_context, tls_server
from tls_certs import Certs

OPERATION_TIMEOUT_S = 10


@pytest.fixture(scope="module")
def material():
    directory = tempfile.mkdtemp(prefix="magnetar-security-")
    try:
        certs = Certs(directory)
        certs.ca_main = certs.ca("test-ca")
        certs.server = certs.leaf(certs.ca_main, "localhost")
        certs.admin = certs.leaf(certs.ca_main, "ops-admin")
        certs.app = certs.leaf(certs.ca_main, "app")
        certs.keys = Keys(directory)
        yield certs
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _secured(material):
    extra = ('[authentication]\nenabled = true\nproviders = ["tls", "token"]\n'
             'token_secret_key = "file://%s"\n'
             '[authorization]\nenabled = true\nsuper_user_roles = ["ops-admin"]\n'
             % material.keys.secret_path)
    return tls_server(material.server, trust=material.ca_main["cert"], require=False,
                      plain=False, extra_toml=extra)


def _https(method, url, material, client_cert, body=None):
    """(status, body) of an HTTPS admin request authenticated by `client_cert`."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    context = _ssl_context(material.ca_main["cert"], client_cert)
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _tls_client(srv, material, authentication):
    return pulsar.Client(srv.tls_service_url,
                         tls_trust_certs_file_path=material.ca_main["cert"],
                         tls_validate_hostname=True, authentication=authentication,
                         operation_timeout_seconds=OPERATION_TIMEOUT_S)


def test_mtls_role_is_authorized_by_its_certificate_name(material):
    with _secured(material) as srv:
        topic = unique_topic("mtls-role")
        app = _tls_client(srv, material, pulsar.AuthenticationTLS(material.app["cert"],
                                                                   material.app["key"]))
        try:
            # `app` has no permission yet: refused by authorization, so it was authenticated.
            with pytest.raises(pulsar.AuthorizationError):
                app.create_producer(topic)
            # The admin API over HTTPS: `app`'s certificate may not grant, the super-user's may.
            grant_url = srv.tls_web_url + "/admin/v2/namespaces/public/default/permissions/app"
            status, body = _https("POST", grant_url, material, material.app, ["produce"])
            assert status == 403, (status, body)
            status, body = _https("POST", grant_url, material, material.admin, ["produce"])
            assert status == 204, (status, body)
            status, body = _https("GET", srv.tls_web_url
                                  + "/admin/v2/namespaces/public/default/permissions",
                                  material, material.admin)
            assert status == 200 and json.loads(body).get("app") == ["produce"], body
            producer = app.create_producer(topic)
            producer.send(b"by certificate")
            producer.close()
            # Produce only: subscribing is still refused.
            with pytest.raises(pulsar.AuthorizationError):
                app.subscribe(topic, "sub")
        finally:
            app.close()


def test_https_admin_without_credentials_is_401(material):
    with _secured(material) as srv:
        status, body = _https("GET", srv.tls_web_url + "/admin/v2/tenants", material, None)
        assert status == 401, (status, body)
        assert b"reason" in body
        status, body = _https("GET", srv.tls_web_url + "/admin/v2/tenants", material,
                              material.admin)
        assert status == 200 and "public" in json.loads(body), body


def test_token_over_tls_as_a_super_user(material):
    with _secured(material) as srv:
        topic = unique_topic("token-tls")
        token = material.keys.hs_token("ops-admin")
        c = _tls_client(srv, material, pulsar.AuthenticationToken(token))
        try:
            consumer = c.subscribe(topic, "sub")
            producer = c.create_producer(topic)
            producer.send(b"over tls with a token")
            message = consumer.receive(timeout_millis=10000)
            assert message.data() == b"over tls with a token"
            consumer.acknowledge(message)
        finally:
            c.close()
        # A token signed with another key is refused over TLS as over plain TCP.
        forged = Keys(tempfile.mkdtemp(prefix="magnetar-other-key-")).hs_token("ops-admin")
        bad = _tls_client(srv, material, pulsar.AuthenticationToken(forged))
        try:
            with pytest.raises(Exception):
                bad.create_producer(topic)
        finally:
            bad.close()


def test_rs256_token_over_tls(material):
    """RS256 (a key pair made by `magnetar tokens`) over `pulsar+ssl://`, hostname verified."""
    with tls_server(material.server, plain=False,
                    extra_toml=material.keys.public_toml()) as srv:
        topic = unique_topic("rs256-tls")
        c = _tls_client(srv, material, pulsar.AuthenticationToken(
            material.keys.rs_token("app", "1h")))
        try:
            consumer = c.subscribe(topic, "sub")
            producer = c.create_producer(topic)
            producer.send(b"rs256 over tls")
            message = consumer.receive(timeout_millis=10000)
            assert message.data() == b"rs256 over tls"
        finally:
            c.close()
