"""Retention and disk reclaim, with the official Python client, on brokers of their own with
small ledgers and a retention pass every second:

- what every subscription consumed goes, and the data directory shrinks below a bound;
- retention keeps what it covers (readable by a new reader from the earliest position) and
  lets the rest go;
- kill -9 while ledgers are being trimmed: after a restart the subscription gets every message
  it had not acknowledged, and the restart finishes the trimming;
- deleting a topic (admin DELETE, force) frees its disk;
- inactive-topic deletion (`delete_inactive_topics_*`, Pulsar's `brokerDeleteInactiveTopics*`)
  deletes an idle topic and keeps one with a subscription or a producer.

Magnetar's knobs (TOML given with `--config`): `[broker] max_entries_per_ledger`,
`retention_check_interval_seconds`, `default_retention_size_mb`, `[storage] segment_size_bytes`
and `reserve_mb`.
Pulsar's equivalents are `managedLedgerMaxEntriesPerLedger`, `retentionCheckIntervalInSeconds`
and `defaultRetentionSizeInMB`; the directory bound is ours."""

import json
import os
import shutil
import time

import pulsar
import pytest

import conftest
from compat_util import http_request, unique_topic

MIB = 1024 * 1024
PAYLOAD = 64 * 1024
SEGMENT = 4 * MIB
ENTRIES_PER_LEDGER = 64  # 4 MiB ledgers of unbatched 64 KiB messages
# Freed segment files the server keeps for reuse (its default, set here so the bound says it).
RECYCLED = 8
# The disk reserve (`ledgers/RESERVE`, held back for a disk that fills up): two segments.
RESERVE = 2 * SEGMENT
# Reclaimed means: the current ledger (4 MiB), the segment being written, the ones kept for
# reuse and one more that a cursor ledger may still pin until compaction moves it, the reserve,
# plus the metadata store.
RECLAIMED_BOUND = (5 + RECYCLED) * SEGMENT + RESERVE + 8 * MIB
SHRINK_DEADLINE_S = 60

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("MAGNETAR_TEST_SERVICE_URL") or os.environ.get("MAGNETAR_TEST_SERVER_CMD")),
    reason="needs brokers of its own with Magnetar's retention settings")


def _toml(extra_broker=""):
    return ("# written by tests/compat/test_retention.py\n"
            "[broker]\n"
            "max_entries_per_ledger = %d\n"
            "retention_check_interval_seconds = 1\n"
            "%s\n"
            "[storage]\n"
            "segment_size_bytes = %d\n"
            "max_group_bytes = %d\n"
            "recycled_segments = %d\n"
            "reserve_mb = %d\n" % (ENTRIES_PER_LEDGER, extra_broker, SEGMENT, MIB, RECYCLED,
                                   RESERVE // MIB))


def _start(toml):
    srv = conftest.Server()
    config = os.path.join(srv._tmp, "retention.toml")
    with open(config, "w") as f:
        f.write(toml)
    srv.cmd += ["--config", config]
    try:
        srv.start()
    except BaseException:
        srv.close()
        shutil.rmtree(srv._tmp, ignore_errors=True)
        raise
    return srv


@pytest.fixture
def private_server(request):
    servers = []

    def start(toml):
        srv = _start(toml)
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.close()
        shutil.rmtree(srv._tmp, ignore_errors=True)


def dir_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                pass  # freed while we walked
    return total


def dir_listing(path):
    """Every file under `path` with its size, for a failure message."""
    lines = []
    for root, _, files in os.walk(path):
        for name in sorted(files):
            full = os.path.join(root, name)
            try:
                lines.append("%10d %s" % (os.stat(full).st_size, os.path.relpath(full, path)))
            except FileNotFoundError:
                pass
    return "\n".join(lines)


def internal_stats(srv, topic):
    url = srv.web_url + topic.replace("persistent://", "/admin/v2/persistent/") + "/internalStats"
    return http_request("GET", url)


def wait_for_size(srv, predicate, what, deadline_s=SHRINK_DEADLINE_S, topic=None):
    """Polls the size of `srv`'s data directory until `predicate` holds (the failure message
    lists the files, the topic's ledgers and cursors and the server log)."""
    path = srv.data_dir
    deadline = time.monotonic() + deadline_s
    size = dir_bytes(path)
    while not predicate(size):
        assert time.monotonic() < deadline, "%s: data directory still %.1f MiB after %d s:\n%s\n%s\n%s" % (
            what, size / MIB, deadline_s, dir_listing(path),
            internal_stats(srv, topic) if topic else "", srv.log_tail())
        time.sleep(0.2)  # polling the file system: there is no event to wait on
        size = dir_bytes(path)
    return size


def produce(client, topic, count, first=0):
    producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=60_000,
                                      max_pending_messages=256, block_if_queue_full=True)
    errors = []
    for i in range(first, first + count):
        body = i.to_bytes(8, "big") + bytes(PAYLOAD - 8)
        producer.send_async(body, lambda res, _id: res == pulsar.Result.Ok or errors.append(res))
    producer.flush()
    producer.close()
    assert not errors, errors[:5]


def consume(consumer, count, ack=True):
    """Receives `count` messages (acknowledging each cumulatively); returns their indexes."""
    seen = []
    for _ in range(count):
        msg = consumer.receive(timeout_millis=20_000)
        seen.append(int.from_bytes(msg.data()[:8], "big"))
        if ack:
            consumer.acknowledge_cumulative(msg)
    return seen


def test_consumed_data_is_deleted_and_the_disk_shrinks(private_server):
    srv = private_server(_toml())
    client = srv.client()
    topic = unique_topic("reclaim")
    consumer = client.subscribe(topic, "s", receiver_queue_size=100)
    count = 200 * MIB // PAYLOAD  # 200 MiB
    produce(client, topic, count)
    full = dir_bytes(srv.data_dir)
    assert full > 150 * MIB, "the data is on disk before it is consumed: %.1f MiB" % (full / MIB)
    assert consume(consumer, count) == list(range(count))
    consumer.close()  # the last acknowledgements are flushed
    size = wait_for_size(srv, lambda s: s < RECLAIMED_BOUND, "after consuming 200 MiB",
                         topic=topic)
    # Still a working topic: new messages flow to the subscription.
    consumer = client.subscribe(topic, "s")
    produce(client, topic, 10, first=count)
    assert consume(consumer, 10) == list(range(count, count + 10))
    client.close()
    print("data directory: %.1f MiB full, %.1f MiB after consuming" % (full / MIB, size / MIB))


@pytest.mark.parametrize("where", ["broker-default", "topic-policy", "namespace-policy"])
def test_retention_keeps_what_it_covers_for_a_new_reader(private_server, where):
    retained_mb = 40
    # Time -1 (unlimited): with time 0, a ledger expires at once whatever the size says
    # (Pulsar deletes a ledger that is over either limit).
    policy = {"retentionTimeInMinutes": -1, "retentionSizeInMB": retained_mb}
    if where == "broker-default":
        srv = private_server(_toml("default_retention_size_mb = %d\n"
                                   "default_retention_time_minutes = -1" % retained_mb))
    else:
        srv = private_server(_toml())
    client = srv.client()
    topic = unique_topic("retained")
    if where == "namespace-policy":
        tenant_ns = "retention-%d" % int(time.time() * 1000)
        status, body = http_request("PUT", srv.web_url + "/admin/v2/namespaces/public/" + tenant_ns)
        assert status == 204, body
        topic = "persistent://public/%s/retained" % tenant_ns
        url = srv.web_url + "/admin/v2/namespaces/public/%s/retention" % tenant_ns
    else:
        url = srv.web_url + topic.replace("persistent://", "/admin/v2/persistent/") + "/retention"
    if where != "broker-default":
        status, body = http_request("POST", url, json.dumps(policy))
        assert status == 204, (status, body)
        status, body = http_request("GET", url)
        assert status == 200 and json.loads(body) == policy, body
    consumer = client.subscribe(topic, "s", receiver_queue_size=100)
    count = 160 * MIB // PAYLOAD
    produce(client, topic, count)
    consume(consumer, count)
    consumer.close()
    # Down to the retained size (plus the same slack as above), not below it.
    # (Ledgers go whole: up to one ledger more than the retention size stays.)
    ledger = ENTRIES_PER_LEDGER * PAYLOAD
    size = wait_for_size(srv, lambda s: s < retained_mb * MIB + ledger + RECLAIMED_BOUND,
                         "with %d MiB retention" % retained_mb, topic=topic)
    print("data directory with %d MiB retention: %.1f MiB" % (retained_mb, size / MIB))
    # Ledgers go whole, so a ledger must never take more than its limit (not even while the
    # next one is being created under load).
    status, body = internal_stats(srv, topic)
    assert status == 200, body
    ledgers = json.loads(body)["ledgers"]
    assert all(l["entries"] <= ENTRIES_PER_LEDGER for l in ledgers), ledgers
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    seen = []
    while reader.has_message_available():
        seen.append(int.from_bytes(reader.read_next(timeout_millis=20_000).data()[:8], "big"))
    reader.close()
    assert seen, "retention keeps messages for a reader"
    assert seen == list(range(seen[0], count)), "the retained messages are the newest, no holes"
    kept_mib = len(seen) * PAYLOAD / MIB
    # What the retention size covers stays (ledgers go whole, so a little more may stay).
    assert retained_mb <= kept_mib + 1, \
        "%.1f MiB kept with %d MiB retention" % (kept_mib, retained_mb)
    assert seen[0] > 0, "the oldest messages went"
    client.close()


def test_kill_during_trimming_loses_nothing_unacknowledged(private_server):
    srv = private_server(_toml())
    client = srv.client()
    topic = unique_topic("trim-crash")
    consumer = client.subscribe(topic, "s", receiver_queue_size=100)
    count = 120 * MIB // PAYLOAD
    acked = count * 2 // 3
    produce(client, topic, count)
    full = dir_bytes(srv.data_dir)
    consume(consumer, acked)
    # Kill -9 as soon as trimming has visibly started.
    wait_for_size(srv, lambda s: s < full - 2 * SEGMENT, "trimming starts")
    client.close()
    srv.kill()
    srv.start()
    client = srv.client()
    consumer = client.subscribe(topic, "s", receiver_queue_size=100)
    # At-least-once: acknowledgements in flight at the kill may come back, nothing unacked is lost.
    first = consume(consumer, 1, ack=False)[0]
    assert first <= acked, "message %d was never acknowledged but is gone" % acked
    rest = consume(consumer, count - first - 1)
    assert [first] + rest == list(range(first, count)), "every unacknowledged message, in order"
    client.close()
    # The restart finishes the job: everything consumed goes.
    wait_for_size(srv, lambda s: s < RECLAIMED_BOUND, "after the restart")


def test_deleting_a_topic_frees_its_disk(private_server):
    srv = private_server(_toml())
    client = srv.client()
    topic = unique_topic("deleted")
    consumer = client.subscribe(topic, "backlog")  # holds every message
    count = 100 * MIB // PAYLOAD
    produce(client, topic, count)
    assert dir_bytes(srv.data_dir) > 80 * MIB
    consumer.close()
    client.close()
    path = topic.replace("persistent://", "/admin/v2/persistent/")
    status, body = http_request("DELETE", srv.web_url + path + "?force=true")
    assert status == 204, (status, body)
    wait_for_size(srv, lambda s: s < RECLAIMED_BOUND, "after deleting the topic")
    status, body = http_request("GET", srv.web_url + "/admin/v2/persistent/public/default")
    assert status == 200 and topic not in json.loads(body), body


def test_inactive_topics_are_deleted_when_the_policy_says_so(private_server):
    srv = private_server(_toml("delete_inactive_topics_enabled = true\n"
                               "delete_inactive_topics_frequency_seconds = 1\n"
                               "delete_inactive_topics_max_inactive_duration_seconds = 2"))
    client = srv.client()
    idle, subscribed, busy = (unique_topic(p) for p in ("idle", "subscribed", "busy"))
    produce(client, idle, 5)
    client.subscribe(subscribed, "keep").close()
    produce(client, subscribed, 5)
    busy_producer = client.create_producer(busy)
    busy_producer.send(b"x")

    def topics():
        status, body = http_request("GET", srv.web_url + "/admin/v2/persistent/public/default")
        assert status == 200, body
        return set(json.loads(body))

    deadline = time.monotonic() + 30
    while idle in topics():
        assert time.monotonic() < deadline, "the idle topic is still there after 30 s"
        time.sleep(0.5)  # polling the housekeeping pass: there is no event to wait on
    # Mode delete_when_no_subscriptions: a topic with a subscription stays, and so does one
    # with a producer connected.
    left = topics()
    assert subscribed in left and busy in left, left
    busy_producer.send(b"still works")
    client.close()
