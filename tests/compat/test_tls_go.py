"""The official Go client over TLS: tests/go/tls_test.go (build tag `tls`, left out of the plain
`go test ./...` of test_go_client.py) run against brokers this file starts with `[tls]` and
certificates made here (see test_tls.py for the Python client)."""

import shutil
import tempfile

import pytest

from test_tls import tls_server
from tls_certs import Certs
from go_runner import BUILD_AND_RUN_TIMEOUT_S, needs_go, run_go_test


@pytest.fixture(scope="module")
def certs():
    directory = tempfile.mkdtemp(prefix="magnetar-tls-go-certs-")
    try:
        c = Certs(directory)
        c.ca_main = c.ca("test-ca")
        yield c
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def run_go_tls(test_name, env):
    run_go_test("tls", test_name, env)


@needs_go
@pytest.mark.timeout(BUILD_AND_RUN_TIMEOUT_S + 120)
def test_go_client_cert_required(certs):
    server = certs.leaf(certs.ca_main, "localhost")
    client = certs.leaf(certs.ca_main, "go-client")
    ca = certs.ca_main["cert"]
    with tls_server(server, trust=ca, require=True) as srv:
        run_go_tls("TestTLSClientCertRequired", {
            "MAGNETAR_TEST_TLS_SERVICE_URL": srv.tls_service_url,
            "MAGNETAR_TEST_TLS_CA": ca,
            "MAGNETAR_TEST_TLS_CLIENT_CERT": client["cert"],
            "MAGNETAR_TEST_TLS_CLIENT_KEY": client["key"],
        })


@needs_go
@pytest.mark.timeout(BUILD_AND_RUN_TIMEOUT_S + 120)
def test_go_hostname_mismatch(certs):
    wrong = certs.leaf(certs.ca_main, "wrong.example", san="DNS:wrong.example")
    with tls_server(wrong) as srv:
        run_go_tls("TestTLSHostnameMismatch", {
            "MAGNETAR_TEST_TLS_SERVICE_URL": srv.tls_service_url,
            "MAGNETAR_TEST_TLS_CA": certs.ca_main["cert"],
        })
