"""Limits and quotas (issue 14) through the official client: message TTL and on-demand expiry,
backlog quotas (each policy), max unacked messages per consumer, max producers and consumers,
publish and dispatch rates, the topic's max message size.

Most tests need broker defaults of their own (a small TTL, a backlog quota, a rate): they start a
private broker with a config file, which exercises the same enforcement as namespace or topic
policies (one `Effective` per topic). The on-demand expiry tests use the admin paths Pulsar has:
`POST …/subscription/{sub}/expireMessages/{seconds}`, `POST …/subscription/{sub}/expireMessages`
(a message id body) and `POST …/all_subscription/expireMessages/{seconds}`.
"""

import json
import re
import shutil
import subprocess
import threading
import time

import pulsar
import pytest

import conftest
from go_runner import BUILD_AND_RUN_TIMEOUT_S as GO_BUILD_AND_RUN_TIMEOUT_S
from go_runner import needs_go, run_go_test
from java_runner import BUILD_AND_RUN_TIMEOUT_S as JAVA_BUILD_AND_RUN_TIMEOUT_S
from java_runner import needs_java, run_java_tests
from compat_util import (assert_nothing_more, drain, eventually, http_request, payloads,
                         receive_n, short_name, unique_topic)

DEADLINE_S = 20


def private_server(broker_toml):
    return conftest.private_server("[broker]\n" + broker_toml)


def _eventually(what, check, deadline_s=DEADLINE_S, every_s=0.2):
    return eventually(what, check, deadline_s, every_s)


def _first_payload(client, topic, sub, timeout_ms=500):
    """The first message a fresh consumer of `sub` gets (not acknowledged), or None."""
    consumer = client.subscribe(topic, sub, consumer_type=pulsar.ConsumerType.Shared)
    try:
        return consumer.receive(timeout_millis=timeout_ms).data().decode()
    except pulsar.Timeout:
        return None
    finally:
        consumer.close()


def _make_subscription(client, topic, sub):
    client.subscribe(topic, sub, consumer_type=pulsar.ConsumerType.Shared).close()


def _produce(client, topic, count, prefix="m", size=0):
    producer = client.create_producer(topic)
    ids = []
    for i in range(count):
        body = ("%s-%d" % (prefix, i)).encode()
        ids.append(producer.send(body + b"." * max(0, size - len(body))))
    producer.close()
    return ids


# ------------------------------------------------------------------------------------- TTL
def test_messages_older_than_the_ttl_are_expired_for_every_subscription():
    with private_server("ttl_duration_default_seconds = 2\n"
                        "message_expiry_check_interval_seconds = 1\n") as srv:
        topic = unique_topic("ttl")
        client = srv.client()
        try:
            _make_subscription(client, topic, "a")
            _make_subscription(client, topic, "b")
            _produce(client, topic, 5, prefix="old")
            for sub in ("a", "b"):
                _eventually("the old messages expire on %s" % sub,
                            lambda sub=sub: _first_payload(client, topic, sub) is None)
            _produce(client, topic, 1, prefix="new")
            consumer = client.subscribe(topic, "a", consumer_type=pulsar.ConsumerType.Shared)
            assert payloads(receive_n(consumer, 1)) == ["new-0"]
            assert_nothing_more(consumer)
        finally:
            client.close()


# ---------------------------------------------------------------------- on-demand expiry
def _admin_topic(server, topic):
    return server.web_url + "/admin/v2/persistent/public/default/" + short_name(topic)


def test_expire_messages_on_demand_by_time_and_for_all_subscriptions(server):
    topic = unique_topic("expire")
    client = server.client()
    try:
        for sub in ("a", "b", "c"):
            _make_subscription(client, topic, sub)
        _produce(client, topic, 5, prefix="old")
        base = _admin_topic(server, topic)
        # An hour: nothing is that old.
        status, body = http_request("POST", base + "/subscription/a/expireMessages/3600")
        assert status == 204, body
        assert _first_payload(client, topic, "a", timeout_ms=5000) == "old-0"
        status, body = http_request("POST", base + "/subscription/a/expireMessages/0")
        assert status == 204, body
        assert _first_payload(client, topic, "a") is None
        assert _first_payload(client, topic, "b", timeout_ms=5000) == "old-0", "b untouched"
        status, body = http_request("POST", base + "/all_subscription/expireMessages/0")
        assert status == 204, body
        assert _first_payload(client, topic, "b") is None
        assert _first_payload(client, topic, "c") is None
        status, _ = http_request("POST", base + "/subscription/nope/expireMessages/0")
        assert status == 404
        missing = _admin_topic(server, unique_topic("missing"))
        status, _ = http_request("POST", missing + "/subscription/a/expireMessages/0")
        assert status == 404
    finally:
        client.close()


def test_expire_messages_on_demand_up_to_a_message_id(server):
    topic = unique_topic("expire-pos")
    client = server.client()
    try:
        _make_subscription(client, topic, "s")
        ids = _produce(client, topic, 10)
        position = {"ledgerId": ids[4].ledger_id(), "entryId": ids[4].entry_id(),
                    "partitionIndex": -1}
        status, body = http_request("POST", _admin_topic(server, topic)
                                    + "/subscription/s/expireMessages", json.dumps(position))
        assert status == 204, body
        consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
        assert payloads(receive_n(consumer, 5)) == ["m-%d" % i for i in range(5, 10)]
        assert_nothing_more(consumer)
    finally:
        client.close()


# ------------------------------------------------------------------------- backlog quotas
QUOTA_BYTES = 5000
ENTRY = 500


def _quota_server(policy, limit_bytes=QUOTA_BYTES):
    return private_server("backlog_quota_default_limit_bytes = %d\n"
                          "backlog_quota_default_retention_policy = \"%s\"\n"
                          "backlog_quota_check_interval_seconds = 1\n" % (limit_bytes, policy))


def _fill_backlog(client, topic, producer, count=20):
    for i in range(count):
        producer.send(("m-%d" % i).encode() + b"." * ENTRY)


def test_backlog_quota_producer_exception_refuses_producers_and_fails_sends():
    with _quota_server("producer_exception") as srv:
        topic = unique_topic("quota-exc")
        client = srv.client()
        try:
            _make_subscription(client, topic, "slow")
            producer = client.create_producer(topic, send_timeout_millis=10_000)
            _fill_backlog(client, topic, producer)
            with pytest.raises(pulsar.ProducerBlockedQuotaExceededException):
                client.create_producer(topic)

            def send_fails():
                try:
                    producer.send(b"more")
                    return False
                except pulsar.ProducerBlockedQuotaExceededException:
                    return True
            _eventually("the existing producer's sends fail", send_fails)
            # The backlog consumed, producers are welcome again.
            consumer = client.subscribe(topic, "slow", consumer_type=pulsar.ConsumerType.Shared)
            for msg in drain(consumer, quiet_ms=1000):
                consumer.acknowledge(msg)
            fresh = _eventually("a producer is accepted again",
                                lambda: _try_producer(client, topic))
            fresh.send(b"after")
        finally:
            client.close()


def test_a_small_namespace_quota_set_with_a_string_limit_holds_the_eleventh_send():
    # The Go client's TestSendTimeout: a 10 KiB producer_request_hold quota posted as
    # {"limit": "10240"} (a string, which Pulsar's JSON binding takes as the number), ten 1 KiB
    # sends under a resting subscription, then, a check later, a send is held until it times out.
    with private_server("backlog_quota_check_interval_seconds = 1\n") as srv:
        url = srv.web_url + "/admin/v2/namespaces/public/default/backlogQuota"
        status, body = http_request("POST", url, '{"limit": "10240", "policy": "producer_request_hold"}')
        assert status == 204, body
        status, body = http_request("GET", srv.web_url + "/admin/v2/namespaces/public/default/backlogQuotaMap")
        assert status == 200 and json.loads(body)["destination_storage"]["limitSize"] == 10240, body
        topic = unique_topic("quota-small")
        client = srv.client()
        try:
            _make_subscription(client, topic, "send_timeout_sub")
            producer = client.create_producer(topic, send_timeout_millis=2000,
                                              batching_enabled=False)
            for _ in range(10):
                producer.send(bytes(1024))

            def held():
                try:
                    producer.send(bytes(1024))
                    return False
                except pulsar.Timeout:
                    return True
            # Pulsar's entries with their metadata come to more than 10 KiB: held at the first
            # check after the tenth (Magnetar checks every second here).
            _eventually("a send is held by the quota", held, deadline_s=10)
        finally:
            client.close()


def _try_producer(client, topic):
    try:
        return client.create_producer(topic)
    except (pulsar.ProducerBlockedQuotaExceededException,
            pulsar.ProducerBlockedQuotaExceededError):
        return None


def test_backlog_quota_producer_request_hold_holds_sends_until_the_backlog_shrinks():
    with _quota_server("producer_request_hold") as srv:
        topic = unique_topic("quota-hold")
        client = srv.client()
        try:
            _make_subscription(client, topic, "slow")
            producer = client.create_producer(topic, send_timeout_millis=0)  # no timeout
            _fill_backlog(client, topic, producer)
            with pytest.raises(pulsar.ProducerBlockedQuotaExceededError):
                client.create_producer(topic)
            _eventually("the producer is disconnected", lambda: not producer.is_connected())
            done = threading.Event()
            outcome = []

            def callback(result, msg_id):
                outcome.append(result)
                done.set()
            producer.send_async(b"held", callback)
            assert not done.wait(2.0), "a send completed while the quota is exceeded: %r" % outcome
            consumer = client.subscribe(topic, "slow", consumer_type=pulsar.ConsumerType.Shared)
            for msg in receive_n(consumer, 20):
                consumer.acknowledge(msg)
            assert done.wait(30.0), "the held send never completed"
            assert outcome == [pulsar.Result.Ok]
            assert payloads(receive_n(consumer, 1)) == ["held"]
        finally:
            client.close()


def test_backlog_quota_hold_under_load_stores_every_message_once():
    """producer_request_hold while a thousand sends are in flight, the consumer pausing so the
    backlog goes over the quota again and again: each disconnect answers the sends the broker
    took before CLOSE_PRODUCER and takes none after it. Before, receipts came after the close
    (the client ignores those and resends) and sends written after it were stored: the topic held
    hundreds of messages twice."""
    sending_s = 8
    with _quota_server("producer_request_hold", limit_bytes=100000) as srv:
        topic = unique_topic("quota-hold-load")
        client = srv.client()
        try:
            consumer = client.subscribe(topic, "slow")
            producer = client.create_producer(topic, batching_enabled=False,
                                              max_pending_messages=1000,
                                              block_if_queue_full=True, send_timeout_millis=0)
            answers = []
            ids_by_payload = {}
            sending = threading.Event()
            sending.set()
            sent = [0]

            def consume():
                # Pauses (pacing, not synchronisation): the backlog grows over the quota while
                # the consumer rests, and shrinks under it when it reads again.
                while sending.is_set() or len(ids_by_payload) < sent[0]:
                    resume_at = time.monotonic() + 0.6
                    while time.monotonic() < resume_at:
                        try:
                            msg = consumer.receive(timeout_millis=100)
                        except pulsar.Timeout:
                            continue
                        ids_by_payload.setdefault(int(msg.data()), set()).add(str(msg.message_id()))
                        consumer.acknowledge(msg)
                    if sending.is_set():
                        time.sleep(1.5)

            reader = threading.Thread(target=consume, daemon=True)
            reader.start()
            stop_at = time.monotonic() + sending_s
            try:
                while time.monotonic() < stop_at:
                    i = sent[0]
                    producer.send_async(str(i).encode(),
                                        lambda result, msg_id, i=i: answers.append((i, result)))
                    sent[0] += 1
                producer.flush()
            finally:
                sending.clear()
            n = sent[0]
            reader.join(timeout=60)
            assert not reader.is_alive(), "not every message read within 60 s: %d of %d" % (
                len(ids_by_payload), n)
            assert len(answers) == n and all(r == pulsar.Result.Ok for _, r in answers)
            with open(srv.log_path) as log:
                disconnects = log.read().count("backlog quota exceeded: disconnecting producers")
            assert disconnects >= 3, "the quota disconnected the producer %d times" % disconnects
            twice = sorted(i for i, ids in ids_by_payload.items() if len(ids) > 1)
            assert not twice, "%d stored twice over %d disconnects: %s" % (
                len(twice), disconnects, twice[:10])
            assert sorted(ids_by_payload) == list(range(n))
        finally:
            client.close()


@needs_go
@pytest.mark.timeout(GO_BUILD_AND_RUN_TIMEOUT_S + 60)
def test_go_client_backlog_quota_hold_under_load_stores_every_message_once():
    """The same with the official Go client (tests/go, TestBacklogQuotaHoldUnderLoad...), which
    writes sends while it re-creates a producer the broker closed: those are dropped unanswered
    and resent, never stored twice."""
    with _quota_server("producer_request_hold", limit_bytes=100000) as srv:
        out = run_go_test("quota", "TestBacklogQuotaHoldUnderLoadStoresEveryMessageOnce", {
            "MAGNETAR_TEST_SERVICE_URL": srv.service_url,
            "MAGNETAR_TEST_WEB_URL": srv.web_url,
            # The test sends until the log shows 3 disconnects (at least 8 s, at most 40 s).
            "MAGNETAR_TEST_SERVER_LOG": srv.log_path,
        })
        assert "each stored once" in out, out[-3000:]
        with open(srv.log_path) as log:
            disconnects = log.read().count("backlog quota exceeded: disconnecting producers")
        assert disconnects >= 3, "the quota disconnected the producer %d times" % disconnects


def test_backlog_quota_consumer_backlog_eviction_drops_the_oldest_backlog():
    with _quota_server("consumer_backlog_eviction") as srv:
        topic = unique_topic("quota-evict")
        client = srv.client()
        try:
            _make_subscription(client, topic, "slow")
            producer = client.create_producer(topic)
            _fill_backlog(client, topic, producer)
            _eventually("the oldest backlog is evicted",
                        lambda: (_first_payload(client, topic, "slow") or "m-0.").split(".")[0]
                        != "m-0")
            consumer = client.subscribe(topic, "slow", consumer_type=pulsar.ConsumerType.Shared)
            left = [p.split(".")[0] for p in payloads(drain(consumer, quiet_ms=1000))]
            assert left and left[-1] == "m-19", left
            assert len(left) * (ENTRY + 60) <= QUOTA_BYTES, "still over the quota: %r" % left
            producer.send(b"still-accepted")  # eviction never blocks producers
        finally:
            client.close()


def test_message_age_quota_with_eviction_drops_backlog_older_than_the_limit():
    with private_server("backlog_quota_default_limit_seconds = 2\n"
                        "backlog_quota_default_retention_policy = \"consumer_backlog_eviction\"\n"
                        "backlog_quota_check_interval_seconds = 1\n") as srv:
        topic = unique_topic("quota-age")
        client = srv.client()
        try:
            _make_subscription(client, topic, "slow")
            _produce(client, topic, 5, prefix="old")
            _eventually("the aged backlog is evicted",
                        lambda: _first_payload(client, topic, "slow") is None)
            _produce(client, topic, 1, prefix="new")
            consumer = client.subscribe(topic, "slow", consumer_type=pulsar.ConsumerType.Shared)
            assert payloads(receive_n(consumer, 1)) == ["new-0"]
        finally:
            client.close()


# ------------------------------------------------------------- unacked, producers, consumers
@pytest.fixture(scope="module")
def limits_server():
    with private_server("max_unacked_messages_per_consumer = 10\n"
                        "max_producers_per_topic = 2\n"
                        "max_consumers_per_topic = 3\n"
                        "max_consumers_per_subscription = 2\n") as srv:
        yield srv


def test_a_shared_consumer_gets_max_unacked_messages_then_resumes_at_half(limits_server):
    topic = unique_topic("unacked")
    client = limits_server.client()
    try:
        consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                                    receiver_queue_size=1000)
        _produce(client, topic, 30)
        first = receive_n(consumer, 10)
        assert_nothing_more(consumer, wait_ms=1500)
        for msg in first[:4]:
            consumer.acknowledge(msg)
        # 6 unacked: more than half of 10, still blocked.
        assert_nothing_more(consumer, wait_ms=1000)
        consumer.acknowledge(first[4])
        # 5 unacked: half, unblocked until 10 again.
        more = receive_n(consumer, 5)
        assert_nothing_more(consumer, wait_ms=1000)
        assert payloads(first + more) == ["m-%d" % i for i in range(15)]
    finally:
        client.close()


def test_max_producers_per_topic(limits_server):
    topic = unique_topic("max-producers")
    client = limits_server.client()
    try:
        client.create_producer(topic)
        client.create_producer(topic)
        with pytest.raises(pulsar.ProducerBusy):  # "Topic reached max producers limit"
            client.create_producer(topic)
    finally:
        client.close()


def test_max_consumers_per_subscription_and_per_topic(limits_server):
    topic = unique_topic("max-consumers")
    client = limits_server.client()
    try:
        shared = pulsar.ConsumerType.Shared
        client.subscribe(topic, "a", consumer_type=shared)
        client.subscribe(topic, "a", consumer_type=shared)
        with pytest.raises(pulsar.ConsumerBusy):  # "Subscription reached max consumers limit"
            client.subscribe(topic, "a", consumer_type=shared)
        client.subscribe(topic, "b", consumer_type=shared)
        with pytest.raises(pulsar.ConsumerBusy):  # "Topic reached max consumers limit"
            client.subscribe(topic, "c", consumer_type=shared)
    finally:
        client.close()


# ------------------------------------------------------------------------------------ rates
RATE = 20


def test_publish_rate_bounds_throughput_without_failing_sends():
    with private_server("max_publish_rate_per_topic_in_messages = %d\n" % RATE) as srv:
        topic = unique_topic("publish-rate")
        client = srv.client()
        try:
            producer = client.create_producer(topic, batching_enabled=False)
            started = time.monotonic()
            for i in range(3 * RATE):
                producer.send(b"m-%d" % i)  # each one succeeds, only later
            elapsed = time.monotonic() - started
            # A burst of RATE, then RATE per second: 2 s for the other 2 * RATE.
            assert elapsed >= 1.5, "%d messages in %.2f s" % (3 * RATE, elapsed)
        finally:
            client.close()


@pytest.mark.parametrize("domain", ["persistent", "non-persistent"])
def test_a_topic_publish_rate_set_while_producing_holds_on_both_domains(server, domain):
    """The topic's `publishRate` policy, set while its producer is open, paces it on
    non-persistent topics too (Pulsar's NonPersistentTopic has the same publish rate limiter):
    every send succeeds, later; the stats count the pauses (`publishRateLimitedTimes`) and the
    consumer gets every message in order."""
    name = short_name(unique_topic("publish-rate-policy"))
    topic = "%s://public/default/%s" % (domain, name)
    url = "%s/admin/v2/%s/public/default/%s" % (server.web_url, domain, name)
    client = server.client()
    try:
        consumer = client.subscribe(topic, "s")
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(b"before")
        rate = json.dumps({"publishThrottlingRateInMsg": RATE, "publishThrottlingRateInByte": -1})
        status, body = http_request("POST", url + "/publishRate", rate)
        assert status in (200, 204), (status, body)
        started = time.monotonic()
        for i in range(3 * RATE):
            producer.send(b"m-%d" % i)
        elapsed = time.monotonic() - started
        # A burst of RATE, then RATE per second: 2 s for the other 2 * RATE.
        assert elapsed >= 1.5, "%d messages in %.2f s" % (3 * RATE, elapsed)
        status, body = http_request("GET", url + "/stats")
        assert status == 200, body
        assert json.loads(body)["publishRateLimitedTimes"] > 0, body
        got = receive_n(consumer, 1 + 3 * RATE)
        assert payloads(got) == ["before"] + ["m-%d" % i for i in range(3 * RATE)]
    finally:
        client.close()


@pytest.mark.parametrize("knob", ["dispatch_throttling_rate_per_topic_in_msg",
                                  "dispatch_throttling_rate_per_subscription_in_msg"])
def test_dispatch_rate_bounds_delivery(knob):
    with private_server("%s = %d\n" % (knob, RATE)) as srv:
        topic = unique_topic("dispatch-rate")
        client = srv.client()
        try:
            _make_subscription(client, topic, "s")
            _produce(client, topic, 3 * RATE)
            consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
            started = time.monotonic()
            got = receive_n(consumer, 3 * RATE)
            elapsed = time.monotonic() - started
            assert payloads(got) == ["m-%d" % i for i in range(3 * RATE)]
            assert elapsed >= 1.5, "%d messages in %.2f s" % (3 * RATE, elapsed)
        finally:
            client.close()


# ------------------------------------------------------------------------ max message size
@pytest.mark.parametrize("domain", ["persistent", "non-persistent"])
def test_a_message_over_the_topic_max_message_size_is_refused(server, domain):
    """The broker answers SEND_ERROR (NotAllowed, "Exceed maximum message size", as Pulsar) and
    stores nothing, on non-persistent topics too (Pulsar's NonPersistentTopic checks it). The
    policy is set while the producer is open: it applies at once to both kinds. The C++ client (Python's) answers any send
    error but a checksum error by reconnecting and resending, and each reconnect re-arms its
    send timeout: against Pulsar as against us it retries until closed. So the test watches the
    broker: the client drops the connection the error came on, the topic never gets the
    message (no consumer receives it), and closing the client fails it."""
    name = short_name(unique_topic("max-size"))
    topic = "%s://public/default/%s" % (domain, name)
    url = "%s/admin/v2/%s/public/default/%s" % (server.web_url, domain, name)
    client = server.client()
    # On a client of its own: the producer's client drops its connection on the send error,
    # which would redeliver to a consumer sharing it.
    consuming = server.client()
    try:
        consumer = consuming.subscribe(topic, "s")  # the topic exists
        producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=3000)
        status, body = http_request("POST", url + "/maxMessageSize", "10000")
        if status in (404, 405):
            pytest.skip("no topic maxMessageSize endpoint on this branch (status %d)" % status)
        assert status in (200, 204), body
        producer.send(b"x" * 5000)
        results = []
        producer.send_async(b"y" * 20000, lambda result, _id: results.append(result))

        def refused():
            # The client drops its connection when told SEND_ERROR; nothing was stored.
            status, body = http_request("GET", url + "/stats")
            assert status == 200, body
            stats = json.loads(body)
            assert stats["msgInCounter"] == 1, "only the 5000-byte message is taken"
            return not stats["publishers"]
        _eventually("the oversized message refused", refused)
        assert receive_n(consumer, 1)[0].data() == b"x" * 5000
        assert_nothing_more(consumer)
    finally:
        client.close()  # fails what is still pending
        consuming.close()
    assert results and results[0] != pulsar.Result.Ok, results


def server_on_a_small_disk(toml, size_mb):
    """A broker of the test's own whose data directory is a file system of `size_mb` MiB (a
    tmpfs mounted in a user and mount namespace of its own, which goes when the process does),
    so that the disk really fills: ENOSPC, not a threshold. Skips where namespaces cannot be
    made (unprivileged user namespaces off) or the suite runs against another server."""
    unshare = ["unshare", "--user", "--map-root-user", "--mount"]
    if not shutil.which("unshare") or subprocess.run(unshare + ["true"]).returncode != 0:
        pytest.skip("cannot create a user and mount namespace here (unshare)")
    mount = 'mount -t tmpfs -o size=%dm magnetar-small-disk "$1" && shift && exec "$@"' % size_mb
    return conftest.private_server(
        toml, wrap=lambda srv: unshare + ["sh", "-c", mount, "sh", srv.data_dir] + srv.cmd)


def refused_producer_reason(srv, topic):
    """The reason the broker gives for refusing a new producer on `topic` (raw frames: the
    official client's exception does not carry the broker's message)."""
    import pulsar_wire as wire
    with wire.RawConnection(srv.service_url, timeout=DEADLINE_S) as conn:
        conn.handshake()
        conn.send(wire.simple_frame(wire.cmd_lookup(topic, 1)))
        conn.expect(wire.LOOKUP_RESPONSE)
        conn.send(wire.simple_frame(wire.cmd_producer(topic, 1, 2)))
        return conn.expect(wire.ERROR)[3][0].decode()  # CommandError.message = 3


def metric(srv, name):
    status, text = http_request("GET", srv.web_url + "/metrics")
    assert status == 200, status
    found = re.search(rb"\n" + name.encode() + rb"(\{[^}]*\})? ([0-9.e+]+)\n", text)
    assert found, "%s not in /metrics" % name
    return float(found.group(2))


def test_a_disk_that_fills_up_is_reclaimed_through_the_reserve():
    """The disk really fills (a 48 MiB file system; `min_free_mb = 0`, so no threshold stops the
    broker first, as when another process fills the disk). The journal meets ENOSPC, the store
    gives up its reserve (`reserve_mb`) and the broker refuses new messages with why, while
    everything acknowledged is consumed and the topic deleted: the delete is a journal record,
    which a journal out of space could not write (with `reserve_mb = 0` the delete fails).
    Once the deleted topic's segments are freed, the reserve is back and messages are taken.
    The refusal: the producer is closed and its re-creation refused with
    ProducerBlockedQuotaExceededException ("disk full: ..."), on which the client fails the
    send at once (a send error had it reconnect and resend every 100 ms for as long as the
    disk stayed full, its send timeout never firing)."""
    with server_on_a_small_disk(SMALL_DISK_TOML, 48) as srv:
        assert metric(srv, "magnetar_storage_reserve_bytes") == 8 << 20
        topic = unique_topic("disk-fills")
        client = srv.client()
        try:
            consumer = client.subscribe(topic, "keep")
            producer = client.create_producer(topic, batching_enabled=False,
                                              send_timeout_millis=3000)
            acknowledged, outcome = [], []

            def fill():
                for i in range(2000):  # 125 MiB: far more than the disk holds
                    try:
                        producer.send(i.to_bytes(8, "big") + bytes(64 * 1024 - 8))
                    except pulsar.PulsarException as e:
                        outcome.append(e)
                        return
                    acknowledged.append(i)

            # In a thread: a send that is never failed (the old send-error loop) must fail this
            # test, not hang it.
            filling = threading.Thread(target=fill, daemon=True)
            filling.start()
            filling.join(60)
            assert not filling.is_alive(), "a send neither stored nor failed after 60 s"
            assert outcome and 300 < len(acknowledged) < 2000, (len(acknowledged), outcome)
            refused = outcome[0]
            assert metric(srv, "magnetar_storage_short_of_disk") == 1
            assert metric(srv, "magnetar_storage_reserve_bytes") == 0
            assert "ProducerBlockedQuota" in type(refused).__name__, repr(refused)
            reason = refused_producer_reason(srv, topic)
            assert "disk full" in reason and "reserve" in reason, reason
            received = receive_n(consumer, len(acknowledged))
            seen = [int.from_bytes(m.data()[:8], "big") for m in received]
            assert seen == acknowledged, "every acknowledged message, in order"
            consumer.acknowledge_cumulative(received[-1])
        finally:
            client.close()
        delete_and_see_the_reserve_back(srv, topic)


SMALL_DISK_TOML = ("[storage]\nmin_free_mb = 0\nreserve_mb = 8\nsegment_size_bytes = 4194304\n"
                   "max_group_bytes = 1048576\nrecycled_segments = 1\n")


def delete_and_see_the_reserve_back(srv, topic):
    """Deletes `topic` (a journal record, which needs the reserve's space) and waits until the
    reserve is back and the broker takes messages again."""
    path = "/admin/v2/persistent/" + topic.split("://", 1)[1]
    status, body = http_request("DELETE", srv.web_url + path + "?force=true")
    assert status == 204, (status, body)
    deadline = time.monotonic() + DEADLINE_S
    while metric(srv, "magnetar_storage_reserve_bytes") != 8 << 20:
        assert time.monotonic() < deadline, "the reserve is not back\n" + srv.log_tail()
        time.sleep(0.2)  # polling the broker's metrics: there is no event to wait on
    assert metric(srv, "magnetar_storage_short_of_disk") == 0
    client = srv.client()
    try:
        producer = client.create_producer(unique_topic("after"), batching_enabled=False,
                                          send_timeout_millis=10_000)
        producer.send(b"taken again")
    finally:
        client.close()


@needs_go
@pytest.mark.timeout(GO_BUILD_AND_RUN_TIMEOUT_S + 60)
def test_go_client_on_a_disk_that_fills_up_gets_its_sends_refused_and_loses_nothing():
    """The same with the official Go client (tests/go, build tag `smalldisk`): it sends until a
    send fails with ErrProducerBlockedQuotaExceeded, then consumes everything acknowledged;
    here the topic is deleted and the reserve comes back."""
    with server_on_a_small_disk(SMALL_DISK_TOML, 48) as srv:
        topic = unique_topic("disk-fills-go")
        out = run_go_test("smalldisk", "TestADiskThatFillsUpFailsSendsAndKeepsWhatWasAcknowledged", {
            "MAGNETAR_TEST_SERVICE_URL": srv.service_url,
            "MAGNETAR_TEST_WEB_URL": srv.web_url,
            "MAGNETAR_SMALL_DISK_TOPIC": topic,
        })
        assert "all consumed in order" in out, out[-3000:]
        assert metric(srv, "magnetar_storage_reserve_bytes") == 0
        assert "disk full" in refused_producer_reason(srv, topic)
        delete_and_see_the_reserve_back(srv, topic)


@needs_java
@pytest.mark.timeout(JAVA_BUILD_AND_RUN_TIMEOUT_S + 60)
def test_java_client_on_a_disk_that_fills_up_gets_its_sends_refused_and_loses_nothing():
    """The same with the official Java client (tests/java, SmallDiskTest): its send fails with
    ProducerBlockedQuotaExceededException, everything acknowledged is consumed in order; here
    the topic is deleted and the reserve comes back."""
    with server_on_a_small_disk(SMALL_DISK_TOML, 48) as srv:
        topic = unique_topic("disk-fills-java")
        passed = run_java_tests({"MAGNETAR_TEST_SERVICE_URL": srv.service_url,
                                 "MAGNETAR_TEST_WEB_URL": srv.web_url,
                                 "MAGNETAR_SMALL_DISK_TOPIC": topic},
                                "SmallDiskTest")
        assert passed == ["SmallDiskTest.aDiskThatFillsUpFailsSendsAndKeepsWhatWasAcknowledged"], passed
        assert metric(srv, "magnetar_storage_reserve_bytes") == 0
        assert "disk full" in refused_producer_reason(srv, topic)
        delete_and_see_the_reserve_back(srv, topic)


def test_a_disk_short_of_space_refuses_new_messages_and_keeps_consumers_and_deletes_going():
    """`[storage] min_free_mb` (default 1 GiB) above the disk's free space: the broker refuses
    new messages with why (a producer is refused, ProducerBlockedQuotaExceededException saying
    "disk full: N MiB free ... below the M MiB minimum"), while the official client's consumer still receives and acknowledges what was
    stored before and the topic deletes: what reclaiming the disk needs, which a journal at
    ENOSPC could not even record. Stored first with the check off, then restarted with a
    minimum no disk meets."""
    stored = [b"stored %d" % i for i in range(5)]
    with conftest.private_server("[storage]\nmin_free_mb = 0\n") as srv:
        topic = unique_topic("disk-short")
        client = srv.client()
        try:
            producer = client.create_producer(topic, batching_enabled=False)
            consumer = client.subscribe(topic, "sub")
            for payload in stored:
                producer.send(payload)
            consumer.close()
        finally:
            client.close()
        toml_path = srv.cmd[srv.cmd.index("--config") + 1]
        with open(toml_path, "w") as f:
            f.write("[storage]\nmin_free_mb = 1099511627776\n")  # 2^40 MiB: no disk has it
        srv.restart()

        reason = refused_producer_reason(srv, topic)
        assert "disk full" in reason and "below the" in reason, reason
        client = srv.client()
        try:
            started = time.monotonic()
            with pytest.raises(pulsar.PulsarException) as refused:
                client.create_producer(topic, batching_enabled=False)
            assert "ProducerBlockedQuota" in refused.type.__name__, refused
            assert time.monotonic() - started < DEADLINE_S
        finally:
            client.close()

        client = srv.client()
        try:
            consumer = client.subscribe(topic, "sub")
            received = receive_n(consumer, 5)
            assert [m.data() for m in received] == stored
            for message in received:
                consumer.acknowledge(message)
            assert_nothing_more(consumer)
            consumer.close()
        finally:
            client.close()
        status, metrics = http_request("GET", srv.web_url + "/metrics")
        short = re.search(rb"\nmagnetar_storage_short_of_disk(\{[^}]*\})? 1(\.0)?\n", metrics)
        assert status == 200 and short, metrics[-2000:]
        path = "/admin/v2/persistent/" + topic.split("://", 1)[1]
        status, body = http_request("DELETE", srv.web_url + path)
        assert status == 204, (status, body)
