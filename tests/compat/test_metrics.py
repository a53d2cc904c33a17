"""`GET /metrics` with Pulsar's names, checked against what the official Python client did:

- topic and subscription series (counts, counters, backlog, rates) equal what was sent,
  received and acknowledged;
- the `pulsar_*_le_*` buckets count the last stats interval (a broker of its own with a
  1-second interval);
- OpenMetrics when the scraper asks for it;
- namespace-level aggregation and the split partition label (Pulsar's
  `exposeTopicLevelMetricsInPrometheus` and `splitTopicAndPartitionLabelInPrometheus`);
- consumer- and producer-level series (`exposeConsumerLevelMetricsInPrometheus`,
  `exposeProducerLevelMetricsInPrometheus`), a consumer blocked at its unacked limit, and the
  acknowledgement rate;
- a non-persistent subscription's drop rate (messages its consumer had no permits for);
- connection counters, Magnetar's storage and metadata series, and `process_*`.

The real Prometheus server scrapes the same endpoint in test_prometheus.py."""

import json
import re
import socket
import time
import urllib.request

import os

import pulsar
import pytest

import compat_util
import conftest
from compat_util import http_request, unique_topic

DEADLINE_S = 20

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("MAGNETAR_TEST_SERVICE_URL") or os.environ.get("MAGNETAR_TEST_SERVER_CMD")),
    reason="checks Magnetar's exposition (its own series, its config switches)")
PAYLOAD = 300

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape(srv, accept=None):
    request = urllib.request.Request(srv.web_url + "/metrics")
    if accept:
        request.add_header("Accept", accept)
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.headers.get("Content-Type"), response.read().decode()


def samples(text):
    """[(name, {label: value}, float)] of every sample line."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        assert match, "not a sample line: %r" % line
        name, labels, value = match.groups()
        out.append((name, dict(_LABEL.findall(labels or "")), float(value)))
    return out


def value(text, name, **labels):
    """The one sample of `name` whose labels include `labels` exactly as given."""
    found = [v for n, l, v in samples(text)
             if n == name and all(l.get(k) == str(want) for k, want in labels.items())
             and set(l) >= set(labels)]
    assert len(found) == 1, "%s %s: %d samples" % (name, labels, len(found))
    return found[0]


def eventually(what, check, deadline_s=DEADLINE_S):
    return compat_util.eventually(what, check, deadline_s)


def produce(client, topic, count):
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(count):
        producer.send(b"%08d" % i + bytes(PAYLOAD - 8))
    return producer


def test_topic_and_subscription_series_equal_what_the_client_did(server):
    client = server.client()
    topic = unique_topic("metrics")
    consumer = client.subscribe(topic, "s1", receiver_queue_size=5)
    producer = produce(client, topic, 50)
    for _ in range(20):
        consumer.acknowledge(consumer.receive(timeout_millis=10_000))
    labels = dict(cluster="standalone", namespace="public/default", topic=topic)

    def acked_20():
        _, text = scrape(server)
        return text if value(text, "pulsar_msg_backlog", **labels) == 30 else None
    text = eventually("backlog 30 after 20 acknowledgements", acked_20)
    assert value(text, "pulsar_in_messages_total", **labels) == 50
    in_bytes = value(text, "pulsar_in_bytes_total", **labels)
    assert 50 * PAYLOAD <= in_bytes < 50 * (PAYLOAD + 100), in_bytes  # payload + metadata
    assert value(text, "pulsar_storage_size", **labels) == in_bytes
    assert value(text, "pulsar_producers_count", **labels) == 1
    assert value(text, "pulsar_consumers_count", **labels) == 1
    assert value(text, "pulsar_subscriptions_count", **labels) == 1
    assert value(text, "pulsar_storage_backlog_size", **labels) > 0
    sub = dict(labels, subscription="s1")
    assert value(text, "pulsar_subscription_back_log", **sub) == 30
    assert value(text, "pulsar_subscription_unacked_messages", **sub) <= 5
    assert value(text, "pulsar_subscription_blocked_on_unacked_messages", **sub) == 0
    assert 20 <= value(text, "pulsar_out_messages_total", **sub) <= 25  # 20 + the prefetch
    for stamp in ("last_acked_timestamp", "last_consumed_timestamp"):
        ms = value(text, "pulsar_subscription_" + stamp, **sub)
        assert abs(ms / 1000 - time.time()) < 60, (stamp, ms)
    assert value(text, "pulsar_topics_count", cluster="standalone",
                 namespace="public/default") >= 1
    # Rates: per second over the time since the previous reading (at least a second).
    for _ in range(10):
        producer.send(bytes(PAYLOAD))
    eventually("a non-zero publish rate",
               lambda: value(scrape(server)[1], "pulsar_rate_in", **labels) > 0)
    client.close()


def test_a_non_persistent_subscription_s_drops_are_its_drop_rate(server):
    """A non-persistent topic drops what a consumer has no permits for (Pulsar counts it in
    `msgDropRate`): a consumer that never receives, with a one-message queue, has nearly every
    message dropped; the rate shows in `pulsar_subscription_msg_drop_rate` and in the topic's
    stats (subscription and topic level), while a persistent subscription's is 0."""
    client = server.client()
    try:
        topic = "non-persistent://public/default/drops-%d" % time.monotonic_ns()
        client.subscribe(topic, "slow", receiver_queue_size=1)
        producer = client.create_producer(topic, batching_enabled=False)
        persistent = unique_topic("no-drops")
        client.subscribe(persistent, "s")
        produce(client, persistent, 1)
        stats_url = "%s/admin/v2/non-persistent/public/default/%s/stats" % (
            server.web_url, topic.rsplit("/", 1)[1])
        seen = {}

        def dropping():
            # Sends go on while polling: a rate covers the last second or more, so an idle
            # stretch between two readings would read 0 again.
            for _ in range(20):
                producer.send(bytes(PAYLOAD))
            status, body = http_request("GET", stats_url)
            assert status == 200, body
            stats = json.loads(body)
            seen["subscription"] = max(seen.get("subscription", 0),
                                       stats["subscriptions"]["slow"]["msgDropRate"])
            seen["topic"] = max(seen.get("topic", 0), stats["msgDropRate"])
            text = scrape(server)[1]
            seen["metric"] = max(seen.get("metric", 0), value(
                text, "pulsar_subscription_msg_drop_rate", topic=topic, subscription="slow"))
            seen["persistent"] = value(text, "pulsar_subscription_msg_drop_rate",
                                       topic=persistent, subscription="s")
            return all(seen.get(k, 0) > 0 for k in ("subscription", "topic", "metric"))
        eventually("drop rates above 0", dropping)
        assert seen["persistent"] == 0, seen
        status, body = http_request("GET", server.web_url + "/admin/v2/persistent/public/default/"
                                    + persistent.rsplit("/", 1)[1] + "/stats")
        assert status == 200 and "msgDropRate" not in json.loads(body), body
    finally:
        client.close()


def test_buckets_count_the_last_stats_interval():
    with conftest.private_server("[broker]\nstats_update_frequency_seconds = 1\n") as srv:
        client = srv.client()
        topic = unique_topic("buckets")
        labels = dict(cluster="standalone", namespace="public/default", topic=topic)
        client.create_producer(topic).close()  # the topic is loaded ...
        scrape(srv)  # ... and its first interval starts at this reading
        produce(client, topic, 20).close()

        def window_with_20():
            text = scrape(srv)[1]
            return text if value(text, "pulsar_entry_size_count", **labels) == 20 else None
        text = eventually("an interval holding the 20 entries", window_with_20)
        assert value(text, "pulsar_entry_size_le_512", **labels) == 20  # 300 B + metadata
        latency = [value(text, "pulsar_storage_write_latency_le_%s" % b, **labels)
                   for b in ("0_5", "1", "5", "10", "20", "50", "100", "200", "1000")]
        overflow = value(text, "pulsar_storage_write_latency_overflow", **labels)
        assert sum(latency) + overflow == 20, latency
        assert value(text, "pulsar_storage_write_latency_count", **labels) == 20
        assert value(text, "pulsar_storage_write_latency_sum", **labels) > 0  # microseconds
        # The next interval saw nothing.
        eventually("an empty interval",
                   lambda: value(scrape(srv)[1], "pulsar_entry_size_count", **labels) == 0)
        client.close()


def test_openmetrics_when_the_scraper_asks_for_it(server):
    content_type, text = scrape(server, "application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text"), content_type
    assert text.endswith("# EOF\n")
    assert "# TYPE pulsar_in_messages counter\n" in text  # families without _total
    content_type, text = scrape(server)
    assert content_type.startswith("text/plain; version=0.0.4"), content_type
    assert "# TYPE pulsar_in_messages_total counter\n" in text and "# EOF" not in text


def test_namespace_level_series_and_the_split_partition_label():
    toml = ("[broker]\nexpose_topic_level_metrics_in_prometheus = false\n")
    with conftest.private_server(toml) as srv:
        client = srv.client()
        produce(client, unique_topic("ns-a"), 3).close()
        produce(client, unique_topic("ns-b"), 4).close()
        text = scrape(srv)[1]
        assert 'topic="' not in text, "no topic-level series"
        ns = dict(cluster="standalone", namespace="public/default")
        assert value(text, "pulsar_in_messages_total", **ns) == 7
        assert value(text, "pulsar_topics_count", **ns) == 2
        assert value(text, "pulsar_msg_backlog", remote_cluster="local", **ns) == 0
        client.close()
    toml = ("[broker]\nsplit_topic_and_partition_label_in_prometheus = true\n")
    with conftest.private_server(toml) as srv:
        topic = unique_topic("split")
        status, body = http_request(
            "PUT", srv.web_url + topic.replace("persistent://", "/admin/v2/persistent/")
            + "/partitions", "2")
        assert status == 204, body
        client = srv.client()
        producer = client.create_producer(topic, batching_enabled=False,
                                          message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
        for i in range(4):
            producer.send(b"m%d" % i)
        producer.close()
        text = scrape(srv)[1]
        for partition in ("0", "1"):
            assert value(text, "pulsar_in_messages_total", topic=topic,
                         partition=partition) == 2
        client.close()


def test_consumer_and_producer_series_and_the_unacked_limit():
    """Pulsar's consumer- and producer-level series (off by default, switched on here), the
    consumer blocked at `max_unacked_messages_per_consumer` as metrics and admin stats show it,
    and the subscription's acknowledgement rate."""
    toml = ("[broker]\nexpose_consumer_level_metrics_in_prometheus = true\n"
            "expose_producer_level_metrics_in_prometheus = true\n"
            "max_unacked_messages_per_consumer = 10\n")
    with conftest.private_server(toml) as srv:
        client = srv.client()
        topic = unique_topic("levels")
        consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                                    consumer_name="c-one", receiver_queue_size=1000)
        producer = client.create_producer(topic, producer_name="p-one", batching_enabled=False)
        for _ in range(30):
            producer.send(bytes(PAYLOAD))
        received = [consumer.receive(timeout_millis=10_000) for _ in range(10)]
        for msg in received[:2]:
            consumer.acknowledge(msg)
        labels = dict(cluster="standalone", namespace="public/default", topic=topic)
        sub = dict(labels, subscription="s")
        mine = dict(sub, consumer_name="c-one")

        def blocked_with_8_unacked():
            _, text = scrape(srv)
            ok = (value(text, "pulsar_consumer_unacked_messages", **mine) == 8
                  and value(text, "pulsar_consumer_blocked_on_unacked_messages", **mine) == 1)
            return text if ok else None
        text = eventually("the consumer blocked with 8 unacknowledged", blocked_with_8_unacked)
        consumer_labels = [l for n, l, _ in samples(text)
                           if n == "pulsar_consumer_msg_rate_out" and l.get("topic") == topic]
        assert len(consumer_labels) == 1 and consumer_labels[0]["consumer_id"].isdigit(), \
            consumer_labels
        assert value(text, "pulsar_out_messages_total", **mine) == 10
        # The subscription's own sample: the one without consumer labels.
        assert [v for n, l, v in samples(text)
                if n == "pulsar_out_messages_total" and l == sub] == [10]
        assert value(text, "pulsar_consumer_available_permits", **mine) > 0
        assert value(text, "pulsar_subscription_consumers_count", **sub) == 1
        assert value(text, "pulsar_subscription_blocked_on_unacked_messages", **sub) == 0
        producer_labels = [l for n, l, _ in samples(text)
                           if n == "pulsar_producer_msg_rate_in" and l.get("topic") == topic]
        assert len(producer_labels) == 1, producer_labels
        assert producer_labels[0]["producer_name"] == "p-one"
        assert producer_labels[0]["producer_id"].isdigit(), producer_labels

        status, body = http_request(
            "GET", srv.web_url + topic.replace("persistent://", "/admin/v2/persistent/")
            + "/stats")
        assert status == 200, body
        stats = json.loads(body)
        (consumer_stats,) = stats["subscriptions"]["s"]["consumers"]
        assert consumer_stats["consumerName"] == "c-one"
        assert consumer_stats["blockedConsumerOnUnackedMsgs"] is True, consumer_stats
        assert consumer_stats["unackedMessages"] == 8, consumer_stats

        for msg in received[2:]:
            consumer.acknowledge(msg)
        eventually("a non-zero acknowledgement rate",
                   lambda: value(scrape(srv)[1], "pulsar_subscription_msg_ack_rate", **sub) > 0)
        # The consumer's own: its acknowledgements and when it last acked and was sent one.
        eventually("the consumer's non-zero acknowledgement rate",
                   lambda: value(scrape(srv)[1], "pulsar_consumer_msg_ack_rate", **mine) > 0)
        status, body = http_request(
            "GET", srv.web_url + topic.replace("persistent://", "/admin/v2/persistent/")
            + "/stats")
        (consumer_stats,) = json.loads(body)["subscriptions"]["s"]["consumers"]
        now_ms = time.time() * 1000
        for field in ("lastAckedTimestamp", "lastConsumedTimestamp"):
            assert now_ms - 600_000 < consumer_stats[field] <= now_ms + 1000, consumer_stats
        client.close()


def test_connection_counters_count_clients_and_failed_handshakes(server):
    labels = dict(metric="broker_connection")
    before = scrape(server)[1]
    created = value(before, "pulsar_connection_created_total_count", **labels)
    failed = value(before, "pulsar_connection_create_fail_count", **labels)
    client = server.client()
    client.create_producer(unique_topic("conn")).close()
    with socket.create_connection(("127.0.0.1", server.broker_port), timeout=5) as sock:
        sock.sendall(b"\x00\x00\x00\x08\x00\x00\x00\x04garbage!")  # not a CONNECT
        sock.settimeout(5)
        while sock.recv(1024):
            pass  # the broker closes it

    def counted():
        text = scrape(server)[1]
        return text if value(text, "pulsar_connection_create_fail_count", **labels) > failed \
            else None
    text = eventually("the failed handshake counted", counted)
    assert value(text, "pulsar_connection_created_total_count", **labels) >= created + 2
    assert value(text, "pulsar_active_connections", **labels) >= 1
    assert value(text, "pulsar_connection_create_success_count", **labels) >= 1
    client.close()


def test_storage_metadata_and_process_series_are_plausible(server):
    client = server.client()
    produce(client, unique_topic("storage"), 5).close()
    client.close()
    text = scrape(server)[1]
    assert value(text, "magnetar_journal_groups_total") > 0
    assert value(text, "magnetar_journal_fsync_seconds_count") > 0
    assert value(text, "magnetar_journal_fsync_seconds_bucket", le="+Inf") == \
        value(text, "magnetar_journal_fsync_seconds_count")
    assert value(text, "magnetar_storage_disk_used_bytes") > 0
    assert value(text, "magnetar_storage_disk_free_bytes") > 0
    assert value(text, "magnetar_storage_short_of_disk") == 0, "1 GiB free by default"
    assert value(text, "magnetar_ledger_ledgers") > 0
    assert value(text, "magnetar_metadata_operations_total", op="put") > 0
    assert value(text, "process_resident_memory_bytes") > 1 << 20
    assert value(text, "process_open_fds") > 0
    assert value(text, "process_max_fds") >= value(text, "process_open_fds")
    assert abs(value(text, "process_start_time_seconds") - time.time()) < 24 * 3600
    assert value(text, "process_cpu_seconds_total") > 0
