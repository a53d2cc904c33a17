"""The built-in web console in a real browser: headless Chromium driven by selenium, against the
standalone under load from the official Python client.

- the overview shows non-zero rates and draws its charts from the broker's history;
- the namespace view lists the test's topics with non-zero rates, and the backlog the admin API
  reports;
- a clear-backlog done through the UI (with its confirmation) brings that subscription's backlog
  to zero, in the UI and in the admin API, and leaves the other subscription's alone;
- behind a proxy that asks for a token, the console shows only the login until the right token is
  given, and then sends it on every request.

Screenshots go to tests/compat/screenshots/ (git-ignored). Skipped, with the reason, when
Chromium, chromedriver or selenium is missing (scripts/test.sh installs them where it can).
Every wait is bounded (selenium's WebDriverWait); none is a sleep.
"""

import contextlib
import http.client
import http.server
import json
import os
import shutil
import tempfile
import threading
import urllib.parse
import uuid

import pulsar
import pytest

import conftest
from compat_util import http_request

SCREENSHOTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "screenshots")
WAIT_S = 30            # longest wait for anything the console shows (samples come every 2 s)
HELD = 250             # messages waiting on each subscription of the held topic
CHROMIUM_FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    # Without these Chromium waits on the network at start-up on a machine with no internet.
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--window-size=1400,1000",
]


def _find(name, fallback):
    found = shutil.which(name)
    if found:
        return found
    return fallback if os.access(fallback, os.X_OK) else None


@pytest.fixture
def browser(server):
    # The console is Magnetar's own: against another broker (MAGNETAR_TEST_SERVER_CMD running
    # Apache Pulsar) there is nothing to test.
    status, _ = http_request("GET", server.web_url + "/console/api/history")
    if status != 200:
        pytest.skip("%s serves no Magnetar console (GET /console/api/history: %s)"
                    % (server.web_url, status))
    with chromium() as driver:
        yield driver


@contextlib.contextmanager
def chromium():
    """Headless Chromium under selenium (skips the test when either is missing); quit after."""
    try:
        from selenium import webdriver
    except ImportError:
        pytest.skip("selenium is not installed in the venv (.venv/bin/pip install selenium)")
    chromium = _find("chromium", "/usr/bin/chromium")
    driver_path = _find("chromedriver", "/usr/bin/chromedriver")
    if not chromium or not driver_path:
        pytest.skip("headless Chromium is not installed (Debian: apt-get install chromium "
                    "chromium-driver); found chromium=%s chromedriver=%s" % (chromium, driver_path))
    # Both paths are given, so selenium never looks for (or downloads) a driver itself.
    os.environ.setdefault("SE_OFFLINE", "true")
    profile = tempfile.mkdtemp(prefix="magnetar-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS + ["--user-data-dir=" + profile]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=driver_path),
                              options=options)
    driver.set_page_load_timeout(WAIT_S)
    driver.set_script_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def screenshot(driver, name):
    os.makedirs(SCREENSHOTS, exist_ok=True)
    driver.save_screenshot(os.path.join(SCREENSHOTS, name + ".png"))


def wait_for(driver, what, condition, timeout=WAIT_S):
    """Waits (bounded) until condition(driver) is truthy; on time-out saves a screenshot and
    fails with `what` and the last value seen."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    seen = {}

    def check(d):
        seen["value"] = condition(d)
        return seen["value"]

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.2).until(check)
    except TimeoutException:
        screenshot(driver, "failed-" + what.replace(" ", "-")[:60])
        raise AssertionError("console: %s not seen within %ss (last: %r)"
                             % (what, timeout, seen.get("value")))


def value_of(driver, selector):
    """data-value of the element `selector` matches, or None."""
    return driver.execute_script(
        "const el = document.querySelector(arguments[0]);"
        "return el ? el.dataset.value : null;", selector)


def number_of(driver, selector):
    raw = value_of(driver, selector)
    try:
        return float(raw)
    except (TypeError, ValueError):
        return None


def click(driver, selector):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    element = WebDriverWait(driver, WAIT_S).until(
        ec.element_to_be_clickable((By.CSS_SELECTOR, selector)))
    # In the middle of the window, as a user would have it before clicking.
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", element)
    element.click()


def css(value):
    """A string as a CSS attribute value."""
    return json.dumps(value)


def backlogs(server, topic):
    """msgBacklog of each subscription, from the admin API."""
    path = topic.replace("persistent://", "/admin/v2/persistent/") + "/stats"
    status, body = http_request("GET", server.web_url + path)
    assert status == 200, body
    return {name: sub["msgBacklog"] for name, sub in json.loads(body)["subscriptions"].items()}


class Load:
    """Continuous load on `hot` topics (a producer thread, a consumer thread acknowledging on
    subscription `live`, and a subscription `lagging` nobody reads), and a fixed backlog of
    HELD messages on the `held` topic's two subscriptions."""

    def __init__(self, client, hot, held):
        self.client = client
        self.hot = hot
        self.held = held
        self.stop = threading.Event()
        self.errors = []
        self.sent = 0
        self.producers = [client.create_producer(t, batching_enabled=False) for t in hot]
        self.consumer = client.subscribe(hot, "live", consumer_type=pulsar.ConsumerType.Shared)
        for t in hot:
            client.subscribe(t, "lagging").close()
        for name in ("held-a", "held-b"):
            client.subscribe(held, name, initial_position=pulsar.InitialPosition.Earliest).close()
        producer = client.create_producer(held, batching_enabled=False)
        for i in range(HELD):
            producer.send(b"held-%d" % i)
        producer.close()
        self.threads = [threading.Thread(target=self._produce, daemon=True),
                        threading.Thread(target=self._consume, daemon=True)]
        for thread in self.threads:
            thread.start()

    def _produce(self):
        payload = b"x" * 200
        while not self.stop.is_set():
            for producer in self.producers:
                producer.send_async(payload, self._sent)
            self.stop.wait(0.01)  # pacing, about 100 messages/s per topic

    def _sent(self, result, _msg_id):
        if result == pulsar.Result.Ok:
            self.sent += 1
        elif len(self.errors) < 10:
            self.errors.append(str(result))

    def _consume(self):
        while not self.stop.is_set():
            try:
                self.consumer.acknowledge(self.consumer.receive(timeout_millis=200))
            except pulsar.Timeout:
                continue
            except Exception as e:  # the client closing under us at the end
                if not self.stop.is_set():
                    self.errors.append(repr(e))
                return

    def close(self):
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=10)
        for producer in self.producers:
            producer.flush()
            producer.close()
        self.consumer.close()


def test_console_shows_live_topics_and_clears_a_backlog(server, browser):
    prefix = "console-%s" % uuid.uuid4().hex[:8]
    hot = ["persistent://public/default/%s-hot-%d" % (prefix, i) for i in (1, 2)]
    held = "persistent://public/default/%s-held" % prefix
    client = server.client()
    load = Load(client, hot, held)
    try:
        assert backlogs(server, held) == {"held-a": HELD, "held-b": HELD}
        driver = browser

        # Overview: live totals and charts from the broker's history.
        driver.get(server.web_url + "/")
        wait_for(driver, "overview rate in above zero",
                 lambda d: (number_of(d, "#stat-msgRateIn") or 0) > 0)
        wait_for(driver, "overview rate out above zero",
                 lambda d: (number_of(d, "#stat-msgRateOut") or 0) > 0)
        wait_for(driver, "overview charts with samples", lambda d: d.execute_script(
            "return Array.from(document.querySelectorAll('#view-overview canvas'))"
            ".every(c => Number(c.dataset.points) >= 2);"))
        assert value_of(driver, "#stat-brokers") == "1"
        screenshot(driver, "overview")

        # Tenants -> namespaces -> the namespace's topics, filtered to this test's.
        click(driver, '#tree li[data-tenant="public"] > button')
        click(driver, 'a[data-namespace="public/default"]')
        wait_for(driver, "namespace view", lambda d: d.execute_script(
            "return !!document.querySelector('#view-namespace[data-namespace=\"public/default\"]');"))
        driver.find_element("css selector", "#topic-filter").send_keys(prefix)
        row = lambda t: "#topics tr[data-topic=%s]" % css(t)  # noqa: E731
        for t in hot:
            wait_for(driver, "rates of " + t, lambda d, t=t: all(
                (number_of(d, row(t) + " td[data-field=%s]" % f) or 0) > 0
                for f in ("msgRateIn", "msgRateOut", "msgThroughputIn", "producers")))
        expected = sum(backlogs(server, held).values())
        assert expected == 2 * HELD
        wait_for(driver, "backlog of the held topic",
                 lambda d: number_of(d, row(held) + " td[data-field=backlog]") == expected)
        shown = driver.execute_script(
            "return Array.from(document.querySelectorAll('#topics tr[data-topic]'))"
            ".map(r => r.dataset.topic);")
        assert sorted(shown) == sorted(hot + [held]), shown
        screenshot(driver, "namespace")

        # The held topic: its subscriptions, then clear-backlog on one, confirmed.
        click(driver, row(held) + " a")
        sub = lambda name: "#subscriptions tr[data-subscription=%s]" % css(name)  # noqa: E731
        for name in ("held-a", "held-b"):
            wait_for(driver, "backlog of " + name,
                     lambda d, name=name: number_of(d, sub(name) + " td[data-field=msgBacklog]") == HELD)
        click(driver, sub("held-a") + ' button[data-action="clear-backlog"]')
        wait_for(driver, "confirmation dialog", lambda d: d.execute_script(
            "return document.getElementById('dialog').open;"))
        assert "held-a" in driver.find_element("css selector", "#dialog-body").text
        screenshot(driver, "clear-backlog-confirm")
        click(driver, "#dialog-ok")
        wait_for(driver, "dialog closed", lambda d: not d.execute_script(
            "return document.getElementById('dialog').open;"))
        wait_for(driver, "held-a backlog at zero",
                 lambda d: number_of(d, sub("held-a") + " td[data-field=msgBacklog]") == 0)
        assert backlogs(server, held) == {"held-a": 0, "held-b": HELD}
        assert number_of(driver, sub("held-b") + " td[data-field=msgBacklog]") == HELD
        screenshot(driver, "clear-backlog-done")

        # A hot topic's own page: its charts from the topic's series, its producer and consumer.
        driver.get(server.web_url + "/#/topic/persistent/public/default/" + hot[0].rsplit("/", 1)[1])
        wait_for(driver, "topic charts with samples", lambda d: d.execute_script(
            "return Array.from(document.querySelectorAll('#view-topic canvas'))"
            ".every(c => Number(c.dataset.points) >= 2);"))
        wait_for(driver, "topic rate in", lambda d: (number_of(d, "#stat-msgRateIn") or 0) > 0)
        wait_for(driver, "a producer and a consumer listed", lambda d: d.execute_script(
            "return document.querySelectorAll('#producers tr[data-key]').length >= 1"
            " && document.querySelectorAll('#consumers tr[data-key]').length >= 1;"))
        screenshot(driver, "topic")
        assert not load.errors, load.errors
    finally:
        load.close()
        client.close()


def topic_names(server):
    status, body = http_request("GET", server.web_url + "/admin/v2/persistent/public/default")
    assert status == 200, body
    return json.loads(body)


def confirm(driver, fields=None):
    """Fills the open confirmation dialog's fields ({name: value}, set as the user would see
    them) and confirms."""
    wait_for(driver, "confirmation dialog", lambda d: d.execute_script(
        "return document.getElementById('dialog').open;"))
    for name, value in (fields or {}).items():
        driver.execute_script(
            "const el = document.getElementById('dialog-field-' + arguments[0]);"
            "if (el.type === 'checkbox') el.checked = arguments[1]; else el.value = arguments[1];",
            name, value)
    click(driver, "#dialog-ok")


def wait_closed(driver, what):
    wait_for(driver, what + " done (dialog closed)", lambda d: not d.execute_script(
        "return document.getElementById('dialog').open;"))


def test_console_operations_create_skip_reset_unload_delete(server, browser):
    driver = browser
    prefix = "console-ops-%s" % uuid.uuid4().hex[:8]
    made = "persistent://public/default/%s-made" % prefix
    parts = "persistent://public/default/%s-parts" % prefix
    held = "persistent://public/default/%s-held" % prefix
    client = server.client()
    try:
        client.subscribe(held, "s").close()
        producer = client.create_producer(held, batching_enabled=False)
        for i in range(20):
            producer.send(b"m-%d" % i)
        producer.close()
        assert backlogs(server, held) == {"s": 20}

        # Create: a topic, a partitioned topic, and the same topic again (the API's reason shown).
        driver.get(server.web_url + "/#/ns/public/default")
        click(driver, "#create-topic")
        confirm(driver, {"name": made.rsplit("/", 1)[1], "partitions": "0"})
        wait_closed(driver, "create topic")
        assert made in topic_names(server)
        click(driver, "#create-topic")
        confirm(driver, {"name": parts.rsplit("/", 1)[1], "partitions": "3"})
        wait_closed(driver, "create partitioned topic")
        status, body = http_request("GET", server.web_url + parts.replace(
            "persistent://", "/admin/v2/persistent/") + "/partitions")
        assert (status, json.loads(body)["partitions"]) == (200, 3)
        click(driver, "#create-topic")
        confirm(driver, {"name": made.rsplit("/", 1)[1], "partitions": "0"})
        wait_for(driver, "the API's reason for a duplicate", lambda d: d.execute_script(
            "const e = document.getElementById('dialog-error');"
            "return !e.hidden && e.textContent.includes('already exists');"))
        screenshot(driver, "create-topic-error")
        click(driver, "#dialog-cancel")
        wait_closed(driver, "cancel")

        driver.find_element("css selector", "#topic-filter").send_keys(prefix)
        row = lambda t: "#topics tr[data-topic=%s]" % css(t)  # noqa: E731
        wait_for(driver, "the new topics listed", lambda d: d.execute_script(
            "return Array.from(document.querySelectorAll('#topics tr[data-topic]'))"
            ".map(r => r.dataset.topic).sort().join(' ');") == " ".join(sorted([held, made, parts])))
        assert value_of(driver, row(parts) + " td[data-field=partitions]") == "3"

        # Skip 5, reset to before the first message, unload: the backlog follows.
        click(driver, row(held) + " a")
        backlog = lambda d: number_of(  # noqa: E731
            d, '#subscriptions tr[data-subscription="s"] td[data-field=msgBacklog]')
        wait_for(driver, "backlog 20", lambda d: backlog(d) == 20)
        click(driver, '#subscriptions tr[data-subscription="s"] button[data-action="skip"]')
        confirm(driver, {"count": "5"})
        wait_closed(driver, "skip")
        wait_for(driver, "backlog 15 after skipping 5", lambda d: backlog(d) == 15)
        assert backlogs(server, held) == {"s": 15}

        click(driver, '#subscriptions tr[data-subscription="s"] button[data-action="reset-cursor"]')
        an_hour_ago = driver.execute_script(
            "const d = new Date(Date.now() - 3600 * 1000);"
            "return new Date(d.getTime() - d.getTimezoneOffset() * 60000).toISOString().slice(0, 19);")
        confirm(driver, {"time": an_hour_ago})
        wait_closed(driver, "reset cursor")
        wait_for(driver, "backlog 20 after the reset", lambda d: backlog(d) == 20)
        assert backlogs(server, held) == {"s": 20}

        click(driver, "#unload-topic")
        confirm(driver)
        wait_closed(driver, "unload")
        wait_for(driver, "the unload reported", lambda d: "Unloaded" in d.find_element(
            "css selector", "#banner").text)
        wait_for(driver, "backlog 20 after the unload", lambda d: backlog(d) == 20)

        # Delete, forced: the console goes back to the namespace, and the topic is gone.
        click(driver, "#delete-topic")
        confirm(driver, {"force": True})
        wait_closed(driver, "delete")
        wait_for(driver, "back at the namespace", lambda d: d.execute_script(
            "return !!document.querySelector('#view-namespace');"))
        assert held not in topic_names(server)
        driver.get(server.web_url + "/#/topic/persistent/public/default/" + parts.rsplit("/", 1)[1])
        wait_for(driver, "the partitioned topic's page", lambda d: d.find_element(
            "css selector", "#topic-kind").text == "3 partitions")
        click(driver, "#delete-topic")
        confirm(driver)
        wait_closed(driver, "delete partitioned")
        status, _ = http_request("GET", server.web_url + parts.replace(
            "persistent://", "/admin/v2/persistent/") + "/partitions")
        assert status == 404
        screenshot(driver, "after-deletes")
    finally:
        client.close()


class _AuthProxy(http.server.ThreadingHTTPServer):
    """Forwards to the broker; the API (not the page) needs `Authorization: Bearer <token>`."""

    daemon_threads = True

    def __init__(self, upstream, token):
        self.upstream = urllib.parse.urlparse(upstream)
        self.token = token
        self.authorized_paths = []
        super().__init__(("127.0.0.1", 0), _AuthProxyHandler)


class _AuthProxyHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _forward(self):
        proxy = self.server
        path = self.path.split("?")[0]
        if path.startswith("/admin/") or path.startswith("/console/api/"):
            if self.headers.get("Authorization") != "Bearer " + proxy.token:
                body = b'{"reason":"Authentication required"}'
                self.send_response(401)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            proxy.authorized_paths.append(path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=10)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "accept")}
            conn.request(self.command, self.path, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
            self.send_response(response.status)
            for key, value in response.getheaders():
                if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        finally:
            conn.close()

    do_GET = do_PUT = do_POST = do_DELETE = _forward


def test_console_shows_only_the_login_until_the_token_is_accepted(server, browser):
    proxy = _AuthProxy(server.web_url, "s3cret-token")
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        driver = browser
        url = "http://127.0.0.1:%d/" % proxy.server_address[1]
        driver.get(url)
        visible = lambda d, id_: d.execute_script(  # noqa: E731
            "const el = document.getElementById(arguments[0]); return !!el && !el.hidden;", id_)
        wait_for(driver, "the login form", lambda d: visible(d, "login"))
        assert not visible(driver, "app")
        assert driver.find_element("css selector", "#main").text == ""
        screenshot(driver, "login")

        driver.find_element("css selector", "#login-token").send_keys("wrong")
        click(driver, "#login-submit")
        wait_for(driver, "the refusal", lambda d: "refused" in d.find_element(
            "css selector", "#login-message").text)
        assert not visible(driver, "app")

        driver.find_element("css selector", "#login-token").send_keys("s3cret-token")
        click(driver, "#login-submit")
        wait_for(driver, "the overview after sign-in", lambda d: visible(d, "app") and d.execute_script(
            "return !!document.querySelector('#view-overview') &&"
            " document.querySelector('#stat-brokers').dataset.value === '1';"))
        assert not visible(driver, "login")
        wait_for(driver, "the tenant tree", lambda d: d.execute_script(
            "return !!document.querySelector('#tree li[data-tenant=\"public\"]');"))
        assert "/console/api/history" in proxy.authorized_paths
        assert "/admin/v2/tenants" in proxy.authorized_paths
        # The token lives in this tab's session storage only.
        assert driver.execute_script(
            "return sessionStorage.getItem('magnetar.console.token');") == "s3cret-token"
        screenshot(driver, "signed-in")
    finally:
        proxy.shutdown()
        proxy.server_close()


def test_console_signs_in_against_an_auth_enabled_server(browser):
    """Magnetar itself with `[authentication]` on (no proxy): the page loads (its static files
    are open, as in Pulsar), shows only the login, refuses an expired token and lets in a valid
    one, whose requests then all carry it."""
    from auth_util import Keys, bearer, expired_hs
    with tempfile.TemporaryDirectory(prefix="magnetar-console-auth-") as directory:
        keys = Keys(directory)
        token = keys.hs_token("console-user", "1h")
        with conftest.private_server(keys.secret_toml(), health_headers=bearer(token)) as srv:
            driver = browser
            driver.get(srv.web_url + "/")
            visible = lambda d, id_: d.execute_script(  # noqa: E731
                "const el = document.getElementById(arguments[0]); return !!el && !el.hidden;", id_)
            wait_for(driver, "the login form", lambda d: visible(d, "login"))
            assert not visible(driver, "app")
            driver.find_element("css selector", "#login-token").send_keys(expired_hs(keys.secret))
            click(driver, "#login-submit")
            wait_for(driver, "the refusal", lambda d: "refused" in d.find_element(
                "css selector", "#login-message").text)
            assert not visible(driver, "app")
            driver.find_element("css selector", "#login-token").send_keys(token)
            click(driver, "#login-submit")
            wait_for(driver, "the overview after sign-in", lambda d: visible(d, "app") and d.execute_script(
                "return !!document.querySelector('#view-overview') &&"
                " document.querySelector('#stat-brokers').dataset.value === '1';"))
            wait_for(driver, "the tenant tree", lambda d: d.execute_script(
                "return !!document.querySelector('#tree li[data-tenant=\"public\"]');"))
            assert not visible(driver, "login")
            screenshot(driver, "signed-in-auth-enabled")
