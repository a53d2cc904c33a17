"""Fixtures for the Pulsar-compatibility suite.

The suite talks to a broker only through the official Pulsar Python client, the admin REST API
and raw sockets, so it runs unchanged against Magnetar and against Apache Pulsar.

Which broker:
- default: `target/release/magnetar standalone --broker-port P --web-port W --data-dir D`, started
  once per session on free loopback ports, with a temporary data dir;
- `MAGNETAR_TEST_SERVICE_URL` (+ `MAGNETAR_TEST_WEB_URL`): an external broker that is already
  running; tests marked `restarts_server` are skipped;
- `MAGNETAR_TEST_SERVER_CMD`: another server command line to manage instead of magnetar, with the
  placeholders {broker_port}, {web_port} and {data_dir} (scripts/pulsar-test-server.sh runs real
  Apache Pulsar that way, so even the restart/kill tests can be checked against it).

Other knobs: `MAGNETAR_BIN` (binary path), `MAGNETAR_TEST_START_TIMEOUT` (seconds, default 30),
`MAGNETAR_TEST_READY_PATH` (an extra admin path that must answer 200 before tests start).
"""

import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pulsar
import pytest

import secured
from compat_util import free_port as _free_port, http_request, unique_topic

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
LOG_TAIL_LINES = 150


def magnetar_binary():
    """The binary under test: MAGNETAR_BIN, else the release build."""
    return os.environ.get("MAGNETAR_BIN", os.path.join(REPO_ROOT, "target", "release", "magnetar"))


class Server:
    """A broker under test: the managed magnetar process, or an external one."""

    def __init__(self, external_service_url=None, external_web_url=None):
        self.external = external_service_url is not None
        self.proc = None
        self.health_headers = None  # credentials for the start-up health check
        self.log_path = None
        self.data_dir = None
        self._tmp = None
        self._log_file = None
        self.start_timeout = float(os.environ.get("MAGNETAR_TEST_START_TIMEOUT", "30"))
        self.ready_path = os.environ.get("MAGNETAR_TEST_READY_PATH", "")
        if self.external:
            self.service_url = external_service_url.rstrip("/")
            self.web_url = external_web_url.rstrip("/")
            return
        self._tmp = tempfile.mkdtemp(prefix="magnetar-compat-")
        self.data_dir = os.path.join(self._tmp, "data")
        os.makedirs(self.data_dir)
        self.log_path = os.path.join(self._tmp, "server.log")
        self.broker_port = _free_port()
        self.web_port = _free_port()
        while self.web_port == self.broker_port:
            self.web_port = _free_port()
        self.service_url = "pulsar://127.0.0.1:%d" % self.broker_port
        self.web_url = "http://127.0.0.1:%d" % self.web_port
        template = os.environ.get("MAGNETAR_TEST_SERVER_CMD")
        if template:
            self.cmd = [a.format(broker_port=self.broker_port, web_port=self.web_port,
                                 data_dir=self.data_dir) for a in shlex.split(template)]
            if "/" in self.cmd[0] and not os.path.isabs(self.cmd[0]):
                self.cmd[0] = os.path.join(REPO_ROOT, self.cmd[0])  # relative to the repo
        else:
            binary = magnetar_binary()
            if not os.access(binary, os.X_OK):
                raise RuntimeError("%s not found: build it with `cargo build --release -p magnetar`"
                                   % binary)
            self.cmd = [binary, "standalone", "--broker-port", str(self.broker_port),
                        "--web-port", str(self.web_port), "--data-dir", self.data_dir]

    # ------------------------------------------------------------------ process control
    def running(self):
        return self.external or (self.proc is not None and self.proc.poll() is None)

    def start(self):
        assert not self.external, "cannot start an external broker"
        assert not self.running(), "server already running"
        self._log_file = open(self.log_path, "ab")
        self._log_file.write(("\n===== start %s: %s\n" % (time.strftime("%H:%M:%S"),
                                                          " ".join(self.cmd))).encode())
        self._log_file.flush()
        cmd = self.cmd
        # The server dies with this pytest process even if pytest itself is killed.
        if shutil.which("setpriv"):
            cmd = ["setpriv", "--pdeathsig", "KILL", "--"] + cmd
        env = dict(os.environ, NO_COLOR="1")  # plain text in the log
        self.proc = subprocess.Popen(cmd, stdout=self._log_file, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, cwd=self._tmp, env=env)
        try:
            self.wait_ready()
        except Exception:
            self.kill()
            raise

    def wait_ready(self):
        deadline = time.monotonic() + self.start_timeout
        tcp_ok = health_ok = ready_ok = False
        last = "nothing tried yet"
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError("server exited with code %s during start-up\n%s"
                                   % (self.proc.returncode, self.log_tail()))
            try:
                if not tcp_ok:
                    with socket.create_connection(("127.0.0.1", self.broker_port), timeout=1):
                        tcp_ok = True
                if not health_ok:
                    status, body = http_request("GET", self.web_url + "/admin/v2/brokers/health",
                                                timeout=2, headers=self.health_headers)
                    last = "health answered %s %r" % (status, body[:200])
                    health_ok = status == 200
                if health_ok and self.ready_path and not ready_ok:
                    status, body = http_request("GET", self.web_url + self.ready_path, timeout=2)
                    last = "%s answered %s" % (self.ready_path, status)
                    ready_ok = status == 200
                if tcp_ok and health_ok and (ready_ok or not self.ready_path):
                    return
            except OSError as e:
                last = repr(e)
            time.sleep(0.1)  # polling process start-up: there is no event to wait on
        raise RuntimeError("server not ready after %.0f s (tcp=%s health=%s; last: %s)\n%s"
                           % (self.start_timeout, tcp_ok, health_ok, last, self.log_tail()))

    def stop(self, timeout=60):
        """Graceful stop (SIGTERM). Returns True if the process exited by itself in time;
        otherwise kills it with SIGKILL and returns False."""
        assert not self.external
        if self.proc is None:
            return True
        graceful = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                graceful = False
                self.proc.kill()
                self.proc.wait(timeout=30)
        self._note("stopped (SIGTERM), exit code %s, graceful=%s" % (self.proc.returncode, graceful))
        self.proc = None
        return graceful

    def kill(self):
        """kill -9, no chance to flush anything."""
        assert not self.external
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self._note("killed (SIGKILL), exit code %s" % self.proc.returncode)
        self.proc = None

    def restart(self, graceful=True):
        if graceful:
            ok = self.stop()
        else:
            self.kill()
            ok = True
        self.start()
        return ok

    def close(self):
        if not self.external:
            try:
                self.kill()
            finally:
                if self._log_file:
                    self._log_file.close()

    # ------------------------------------------------------------------ logs
    def _note(self, text):
        if self._log_file and not self._log_file.closed:
            self._log_file.write(("\n===== %s %s\n" % (time.strftime("%H:%M:%S"), text)).encode())
            self._log_file.flush()

    def log_tail(self, lines=LOG_TAIL_LINES):
        if not self.log_path or not os.path.exists(self.log_path):
            return "(no server log: external broker)"
        with open(self.log_path, "rb") as f:
            data = f.read().decode("utf-8", "replace").splitlines()
        return "----- server log %s (last %d lines) -----\n%s" % (
            self.log_path, min(lines, len(data)), "\n".join(data[-lines:]))

    # ------------------------------------------------------------------ helpers
    def client(self, **kwargs):
        kwargs.setdefault("operation_timeout_seconds", 15)
        kwargs.setdefault("connection_timeout_ms", 5000)
        return pulsar.Client(self.service_url, **kwargs)


# ---------------------------------------------------------------------- pytest hooks
def pytest_configure(config):
    config.addinivalue_line(
        "markers", "restarts_server: stops, kills or restarts the broker (skipped on an external one)")


def _external():
    return bool(os.environ.get("MAGNETAR_TEST_SERVICE_URL"))


def pytest_collection_modifyitems(config, items):
    if not _external():
        return
    skip = pytest.mark.skip(reason="needs to restart the broker; MAGNETAR_TEST_SERVICE_URL is set")
    for item in items:
        if "restarts_server" in item.keywords:
            item.add_marker(skip)


_SESSION_SERVER = None


@contextlib.contextmanager
def private_server(toml, health_headers=None, wrap=None):
    """A broker of the test's own, started with the TOML configuration `toml`; stopped and its
    files removed afterwards (its log printed when the test failed). Skips where the suite
    runs against an external broker or a custom command. `wrap(srv)`, if given, returns the
    command to start instead of `srv.cmd` (which it may run inside another)."""
    if os.environ.get("MAGNETAR_TEST_SERVICE_URL") or os.environ.get("MAGNETAR_TEST_SERVER_CMD"):
        pytest.skip("needs a magnetar broker of its own with this configuration:\n" + toml)
    srv = Server()
    # With authentication on, the start-up health check needs credentials.
    srv.health_headers = health_headers
    config = os.path.join(srv._tmp, "private.toml")
    with open(config, "w") as f:
        f.write("# written by the compatibility suite for one test\n" + toml)
    srv.cmd += ["--config", config]
    if wrap is not None:
        srv.cmd = wrap(srv)
    try:
        srv.start()  # its error carries the server log
    except BaseException:
        srv.close()
        shutil.rmtree(srv._tmp, ignore_errors=True)
        raise
    try:
        yield srv
    except BaseException:
        print(srv.log_tail())
        raise
    finally:
        srv.close()
        shutil.rmtree(srv._tmp, ignore_errors=True)



@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and _SESSION_SERVER is not None and not _SESSION_SERVER.external:
        rep.sections.append(("magnetar server log", _SESSION_SERVER.log_tail()))


# ---------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def server(request):
    global _SESSION_SERVER
    if _external():
        web = os.environ.get("MAGNETAR_TEST_WEB_URL")
        if not web:
            pytest.exit("MAGNETAR_TEST_WEB_URL must be set together with MAGNETAR_TEST_SERVICE_URL",
                        returncode=4)
        srv = Server(os.environ["MAGNETAR_TEST_SERVICE_URL"], web)
        _SESSION_SERVER = srv
        yield srv
        return
    srv = Server()
    _SESSION_SERVER = srv
    if secured.enabled():  # TLS, authentication and authorization as Pulsar's client tests run
        secured.configure(srv, magnetar_binary())
    try:
        srv.start()  # its error message carries the server log
        if secured.enabled():
            secured.grant_anonymous(srv)
    except BaseException:
        srv.close()
        raise
    try:
        yield srv
    finally:
        srv.close()
        # the data can be large (preallocated journal segments): never keep it; keep the log
        # only when something failed
        shutil.rmtree(srv.data_dir, ignore_errors=True)
        if request.session.testsfailed:
            print("\nserver log kept at %s" % srv.log_path)
        else:
            shutil.rmtree(srv._tmp, ignore_errors=True)


@pytest.fixture(autouse=True)
def _server_running(request):
    """A test that killed the server and failed before restarting it must not take every
    later test down with it: bring it back before the next test that uses it."""
    if "server" in request.fixturenames:
        srv = request.getfixturevalue("server")
        if not srv.running():
            srv.start()
    yield


@pytest.fixture
def client(server):
    c = server.client()
    yield c
    c.close()


@pytest.fixture
def topic():
    return unique_topic()
