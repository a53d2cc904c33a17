"""The compatibility suite against a secured broker, set up as Pulsar's own client test service
is (pulsar-client-python's test-conf/standalone-ssl.conf and its start script): TLS on ports of
its own beside the plain ones, the tls, token and basic authentication providers, anonymous role
`anonymous`, authorization with super-users `localhost`, `superUser` and `admin`; tenant `public`
administered by `anonymous`, which may produce and consume in `public/default`.

`MAGNETAR_TEST_SECURED=1` starts the session's broker so (conftest.py): the client tests then run
as Pulsar's client suites do, anonymously on the plain port, while the broker authenticates and
authorizes every connection and admin request. `scripts/test.sh` runs the client tests that keep
to `public/default` this way too (SECURED_TESTS there)."""

import json
import os
import subprocess

from compat_util import free_port, http_request
from tls_certs import Certs

SUPER_USER = "superUser"
BASIC_USER, BASIC_PASSWORD = "admin", "123456"


def enabled():
    return bool(os.environ.get("MAGNETAR_TEST_SECURED"))


def configure(srv, binary):
    """Writes the secured configuration into the server's directory and points its command at
    it; the super-user's token goes in `srv.health_headers` (and `srv.super_token`)."""
    directory = os.path.join(srv._tmp, "secured")
    os.makedirs(directory)
    certs = Certs(directory)
    ca = certs.ca("magnetar-test-ca")
    server_cert = certs.leaf(ca, "localhost")
    secret = os.path.join(directory, "secret.key")
    subprocess.run([binary, "tokens", "create-secret-key", "--output", secret], check=True,
                   capture_output=True, timeout=30)
    token = subprocess.run([binary, "tokens", "create", "--secret-key", "file://" + secret,
                            "--subject", SUPER_USER], check=True, capture_output=True, text=True,
                           timeout=30).stdout.strip()
    apr1 = subprocess.run(["openssl", "passwd", "-apr1", BASIC_PASSWORD], check=True,
                          capture_output=True, text=True, timeout=30).stdout.strip()
    users = os.path.join(directory, ".htpasswd")
    with open(users, "w") as f:
        f.write("%s:%s\n" % (BASIC_USER, apr1))
    srv.broker_port_tls = free_port()
    srv.web_port_tls = free_port()
    srv.tls_service_url = "pulsar+ssl://localhost:%d" % srv.broker_port_tls
    srv.tls_web_url = "https://localhost:%d" % srv.web_port_tls
    srv.ca_cert = ca["cert"]
    srv.super_token = token
    srv.health_headers = {"Authorization": "Bearer " + token}
    toml = (
        "# tests/compat/secured.py: Pulsar's client test service set-up\n"
        "[tls]\nenabled = true\ncert_file = %s\nkey_file = %s\ntrust_certs_file = %s\n"
        "broker_port_tls = %d\nweb_port_tls = %d\nplain_ports_enabled = true\n"
        "[authentication]\nenabled = true\nproviders = [\"tls\", \"token\", \"basic\"]\n"
        "token_secret_key = %s\nbasic_users_file = %s\nanonymous_user_role = \"anonymous\"\n"
        "[authorization]\nenabled = true\nsuper_user_roles = [\"localhost\", \"superUser\", \"admin\"]\n"
        % (json.dumps(server_cert["cert"]), json.dumps(server_cert["key"]), json.dumps(ca["cert"]),
           srv.broker_port_tls, srv.web_port_tls, json.dumps("file://" + secret),
           json.dumps(users)))
    config = os.path.join(directory, "secured.toml")
    with open(config, "w") as f:
        f.write(toml)
    srv.cmd += ["--config", config]


def grant_anonymous(srv):
    """As the client test service's start script: `public` administered by `anonymous`, which
    may produce and consume in `public/default`."""
    headers = {"Authorization": "Bearer " + srv.super_token}
    status, body = http_request("POST", srv.web_url + "/admin/v2/tenants/public",
                                body=json.dumps({"adminRoles": ["anonymous"],
                                                 "allowedClusters": ["standalone"]}).encode(),
                                headers=headers)
    assert status in (200, 204), (status, body)
    status, body = http_request(
        "POST", srv.web_url + "/admin/v2/namespaces/public/default/permissions/anonymous",
        body=json.dumps(["produce", "consume"]).encode(), headers=headers)
    assert status in (200, 204), (status, body)
