"""Logs (issue 16): `[log] level` and `format` in the config file; one line per topic load,
producer and consumer open and close with the client's address and version; a client that
sends malformed frames cannot flood the log (one warning a second, with the count left out)."""

import json
import os
import socket
import subprocess
import time

import pytest

import conftest
from compat_util import unique_topic

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("MAGNETAR_TEST_SERVICE_URL") or os.environ.get("MAGNETAR_TEST_SERVER_CMD")),
    reason="reads the log of a Magnetar broker of its own")


def json_lines(srv):
    """The server log's JSON lines (the harness adds its own start/stop lines: skipped)."""
    with open(srv.log_path) as f:
        return [json.loads(line) for line in f if line.startswith("{")]


def wait_for_line(srv, predicate, what, deadline_s=10):
    deadline = time.monotonic() + deadline_s
    while True:
        found = [line for line in json_lines(srv) if predicate(line)]
        if found:
            return found
        assert time.monotonic() < deadline, "no log line %s in:\n%s" % (what, srv.log_tail())
        time.sleep(0.1)  # the log is a file: nothing to wait on


def message(line):
    return line.get("fields", {}).get("message")


def test_json_lines_for_topic_producer_and_consumer_lifecycles():
    toml = '[log]\nlevel = "info,magnetar_admin=warn"\nformat = "json"\n'
    with conftest.private_server(toml) as srv:
        client = srv.client()
        topic = unique_topic("logs")
        producer = client.create_producer(topic)
        consumer = client.subscribe(topic, "s")
        producer.close()
        consumer.close()
        client.close()
        for what in ("topic loaded", "producer opened", "producer closed", "consumer opened",
                     "consumer closed"):
            lines = wait_for_line(srv, lambda l, w=what: message(l) == w
                                  and l["fields"].get("topic") == topic, what)
            fields = lines[0]["fields"]
            assert lines[0]["level"] == "INFO", lines[0]
            if what != "topic loaded":
                assert fields["peer"].startswith("127.0.0.1:"), fields
                assert fields["client"].startswith("Pulsar-CPP-v"), fields  # the client's version


def test_malformed_frames_are_logged_at_most_once_a_second():
    with conftest.private_server('[log]\nformat = "json"\n') as srv:
        started = time.monotonic()
        for _ in range(30):
            with socket.create_connection(("127.0.0.1", srv.broker_port), timeout=5) as sock:
                sock.sendall(b"\x00\x00\x00\x08\x00\x00\x00\x04garbage!")
                sock.settimeout(5)
                while sock.recv(1024):
                    pass  # the broker closes it
        elapsed = time.monotonic() - started
        bad = wait_for_line(srv, lambda l: message(l) == "bad frame; closing connection",
                            "bad frame")
        assert bad[0]["level"] == "WARN"
        assert len(bad) <= int(elapsed) + 1, "%d lines in %.1f s" % (len(bad), elapsed)
        if len(bad) < 30:
            # The next line (if any) says how many were left out; all 30 are accounted for
            # once a line after the burst is written.
            assert all(isinstance(l["fields"]["suppressed"], int) for l in bad)


def test_a_bad_log_level_or_format_stops_the_server_with_a_clear_error(tmp_path):
    for section, expected in (('[log]\nlevel = "info,=[bad"\n', "[log] level"),
                              ('[log]\nformat = "xml"\n', "[log] format")):
        config = tmp_path / "bad.toml"
        config.write_text(section)
        done = subprocess.run([conftest.magnetar_binary(), "standalone", "--config", str(config),
                               "--data-dir", str(tmp_path / "data")],
                              capture_output=True, text=True, timeout=30,
                              env=dict(os.environ, RUST_LOG=""))
        assert done.returncode == 2, done
        assert expected in done.stderr, done.stderr
