"""The secured session broker (MAGNETAR_TEST_SECURED=1, tests/compat/secured.py) is what it says:
authentication and authorization are on, the anonymous role gets only what Pulsar's client
test service grants it, and the TLS listener takes the token and basic credentials the
official Python client sends. Skipped in the plain run."""

import json

import pulsar
import pytest

import secured
from compat_util import http_request, unique_topic

pytestmark = pytest.mark.skipif(not secured.enabled(), reason="needs MAGNETAR_TEST_SECURED=1")


@pytest.fixture
def closed_namespace(server):
    """closed/ns, where anonymous was granted nothing (anonymous administers `public`, so every
    topic there is its own, as for Pulsar's tenant admins)."""
    headers = {"Authorization": "Bearer " + server.super_token}
    tenant = json.dumps({"adminRoles": [], "allowedClusters": ["standalone"]}).encode()
    status, body = http_request("PUT", server.web_url + "/admin/v2/tenants/closed", body=tenant,
                                headers=headers)
    assert status in (200, 204, 409), (status, body)
    status, body = http_request("PUT", server.web_url + "/admin/v2/namespaces/closed/ns",
                                body=b"{}", headers=headers)
    assert status in (200, 204, 409), (status, body)
    return "persistent://closed/ns/"


def test_anonymous_may_use_public_default_and_nothing_more(server, client, closed_namespace):
    topic = unique_topic("secured")
    producer = client.create_producer(topic)
    producer.send(b"anonymous")
    producer.close()
    # Not a super-user: no tenant of its own.
    status, body = http_request("PUT", server.web_url + "/admin/v2/tenants/anon-tenant",
                                body=json.dumps({"adminRoles": [], "allowedClusters":
                                                 ["standalone"]}).encode())
    assert status in (401, 403), (status, body)
    # A namespace it was granted nothing in.
    with pytest.raises(pulsar.AuthorizationError):
        client.create_producer(closed_namespace + topic.rsplit("/", 1)[1])


@pytest.mark.parametrize("how", ["token", "basic"])
def test_the_tls_listener_takes_tokens_and_basic_credentials(server, how, closed_namespace):
    if how == "token":
        authentication = pulsar.AuthenticationToken(server.super_token)
    else:
        authentication = pulsar.AuthenticationBasic(secured.BASIC_USER, secured.BASIC_PASSWORD)
    client = pulsar.Client(server.tls_service_url, tls_trust_certs_file_path=server.ca_cert,
                           tls_validate_hostname=True, authentication=authentication,
                           operation_timeout_seconds=10)
    try:
        # Both roles are super-users: a namespace anonymous may not use.
        topic = closed_namespace + unique_topic("secured-tls").rsplit("/", 1)[1]
        consumer = client.subscribe(topic, "s")
        client.create_producer(topic).send(how.encode())
        assert consumer.receive(10_000).data() == how.encode()
    finally:
        client.close()
