"""Topic compaction (`pulsar-admin topics compact`, `compaction-status`, `compactionThreshold`)
with the official Python client: a readCompacted consumer or reader reads the latest message
per key up to the compaction horizon, then the topic; a null value deletes its key; batches
(compressed or not) are thinned message by message; the compacted ledger survives a restart
and serves keys whose topic ledgers retention deleted. The first two tests are the Python
client's own (`test_publish_compact_and_consume`, `test_null_value_compaction`), with their
waits bounded."""

import json
import os

import pulsar
import pytest

import conftest
from compat_util import (assert_nothing_more, eventually, http_request, payloads, read_n,
                         receive_n, short_name, unique_topic)

TM = 10_000


def _url(server, topic, what="compaction"):
    return "%s/admin/v2/persistent/public/default/%s/%s" % (server.web_url, short_name(topic),
                                                           what)


def _status(server, topic):
    status, body = http_request("GET", _url(server, topic))
    assert status == 200, (status, body)
    return json.loads(body)


def compact(server, topic):
    """Starts a compaction and waits for it to succeed (as the client tests poll)."""
    status, body = http_request("PUT", _url(server, topic), body=b"")
    assert status == 204, (status, body)
    done = {}

    def finished():
        done.update(_status(server, topic))
        return done["status"] != "RUNNING"

    eventually("compaction finished", finished, deadline_s=30)
    assert done == {"status": "SUCCESS", "lastError": ""}, done


def _internal_stats(server, topic):
    status, body = http_request("GET", _url(server, topic, "internalStats"))
    assert status == 200, (status, body)
    return json.loads(body)


def _stats(server, topic):
    status, body = http_request("GET", _url(server, topic, "stats"))
    assert status == 200, (status, body)
    return json.loads(body)


def test_publish_compact_and_consume(client, server):
    topic = unique_topic("compaction")
    producer = client.create_producer(topic, producer_name="my-producer-name",
                                      batching_enabled=False)
    client.subscribe(topic, "my-sub1", is_read_compacted=True).close()
    consumer2 = client.subscribe(topic, "my-sub2", is_read_compacted=False)
    producer.send(b"hello-0", partition_key="key0")
    producer.send(b"hello-1", partition_key="key0")
    producer.close()
    assert _status(server, topic) == {"status": "NOT_RUN", "lastError": ""}
    compact(server, topic)

    consumer1 = client.subscribe(topic, "my-sub1", is_read_compacted=True)
    msg = consumer1.receive(TM)
    assert msg.data() == b"hello-1"
    consumer1.acknowledge(msg)
    consumer1.close()
    reader1 = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    assert reader1.read_next(TM).data() == b"hello-1"
    assert not reader1.has_message_available()
    reader1.close()

    assert payloads(receive_n(consumer2, 2)) == ["hello-0", "hello-1"]
    consumer2.close()
    reader2 = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=False)
    assert payloads(read_n(reader2, 2)) == ["hello-0", "hello-1"]
    reader2.close()

    stats = _stats(server, topic)["compaction"]
    assert stats["lastCompactionRemovedEventCount"] == 1, stats
    assert stats["lastCompactionSucceedTimestamp"] > 0 and stats["lastCompactionFailedTimestamp"] == 0
    ledger = _internal_stats(server, topic)["compactedLedger"]
    assert ledger["ledgerId"] >= 0 and ledger["entries"] == 1, ledger


# The Python client's own test, which its CI runs against the latest Pulsar; Apache Pulsar 4.0.7
# fails it (it still hands out key1 after compaction, checked through scripts/compat-vs-pulsar.sh).
@pytest.mark.skipif(bool(os.environ.get("MAGNETAR_TEST_SERVICE_URL")),
                    reason="Pulsar 4.0.7 keeps a key whose latest message is a null value")
def test_null_value_compaction(client, server):
    topic = unique_topic("null-compact")
    producer = client.create_producer(topic, batching_enabled=False)
    client.subscribe(topic, "my-sub1", is_read_compacted=True).close()
    producer.send(b"hello-1", partition_key="key1")
    producer.send(None, partition_key="key1")
    producer.send(b"hello-2", partition_key="key2")
    producer.send(b"hello-3", partition_key="key3")
    producer.send(None, partition_key="key3")
    producer.send(b"hello-4", partition_key="key4")
    producer.close()
    compact(server, topic)
    consumer = client.subscribe(topic, "my-sub1", is_read_compacted=True)
    messages = receive_n(consumer, 2)
    assert [m.partition_key() for m in messages] == ["key2", "key4"]
    assert_nothing_more(consumer)
    consumer.close()


# Pulsar 4.0.7 keeps a thinned batch whole too, but marks the others `compacted_out` with an
# empty payload, which only its Java client skips: the Python (C++) client hands them out as
# empty messages. Magnetar sends the kept ones as the MESSAGE's `ack_set`, which every client
# honours, so this test is Magnetar's own.
@pytest.mark.skipif(bool(os.environ.get("MAGNETAR_TEST_SERVICE_URL")),
                    reason="Pulsar's C++ client shows thinned-out batch messages as empty ones")
@pytest.mark.parametrize("compression", [pulsar.CompressionType.NONE, pulsar.CompressionType.LZ4])
def test_batches_are_thinned_message_by_message_and_batch_index_acks_complete_them(client, server, compression):
    topic = unique_topic("compact-batch")
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=100,
                                      batching_max_publish_delay_ms=60_000,
                                      compression_type=compression)
    client.subscribe(topic, "compacted", is_read_compacted=True).close()
    for key, value in (("a", "a1"), ("b", "b1"), ("a", "a2"), ("c", "c1"), ("b", "b2")):
        producer.send_async(value.encode(), None, partition_key=key)
    producer.flush()  # one batch of five
    compact(server, topic)
    # Batch-index acks: a client without them acknowledges a batch only once it acked every
    # message of it, and the C++ and Java clients count the thinned-out ones too (the same
    # holds for Pulsar's compacted batches).
    consumer = client.subscribe(topic, "compacted", is_read_compacted=True,
                                batch_index_ack_enabled=True)
    messages = receive_n(consumer, 3)
    assert sorted(payloads(messages)) == ["a2", "b2", "c1"]
    assert_nothing_more(consumer, wait_ms=1000)
    for msg in messages:
        consumer.acknowledge(msg)
    # Acknowledging the kept messages completes the batch: nothing is left in the backlog.
    eventually("backlog drained", lambda: _stats(server, topic)["subscriptions"]["compacted"]
               ["msgBacklog"] == 0, deadline_s=10)
    consumer.close()
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert payloads(read_n(reader, 5)) == ["a1", "b1", "a2", "c1", "b2"]
    reader.close()
    producer.close()


def test_compaction_is_incremental_and_compacted_reads_go_on_in_the_topic(client, server):
    topic = unique_topic("compact-twice")
    producer = client.create_producer(topic, batching_enabled=False)
    for key, value in (("a", "a1"), ("b", "b1"), ("a", "a2")):
        producer.send(value.encode(), partition_key=key)
    compact(server, topic)
    first = _internal_stats(server, topic)["compactedLedger"]["ledgerId"]
    for key, value in (("b", "b2"), ("c", "c1")):
        producer.send(value.encode(), partition_key=key)
    compact(server, topic)
    second = _internal_stats(server, topic)["compactedLedger"]
    assert second["ledgerId"] != first and second["entries"] == 3, (first, second)
    producer.send(b"a3", partition_key="a")  # after the horizon: read from the topic
    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    assert payloads(read_n(reader, 4)) == ["a2", "b2", "c1", "a3"]
    assert not reader.has_message_available()
    reader.close()
    producer.close()


def test_compaction_refusals_and_status(client, server):
    missing = unique_topic("compact-missing")
    status, _ = http_request("PUT", _url(server, missing), body=b"")
    assert status == 404
    volatile = "%s/admin/v2/non-persistent/public/default/%s/compaction" % (
        server.web_url, short_name(unique_topic("compact-np")))
    status, body = http_request("PUT", volatile, body=b"")
    assert status == 404, (status, body)  # missing, before non-persistent (as Pulsar answers)
    topic = unique_topic("compact-empty")
    client.create_producer(topic).close()
    compact(server, topic)  # nothing to compact: a success that changes nothing
    assert _internal_stats(server, topic)["compactedLedger"]["ledgerId"] == -1


@pytest.fixture
def compacting_server():
    # Small ledgers, retention every second, compaction checked every second.
    with conftest.private_server(
            "[broker]\nmax_entries_per_ledger = 2\nretention_check_interval_seconds = 1\n"
            "compaction_check_interval_seconds = 1\n") as srv:
        yield srv


def test_compacted_keys_outlive_their_ledgers_and_a_restart(compacting_server):
    srv = compacting_server
    client = srv.client()
    topic = unique_topic("compact-retained")
    producer = client.create_producer(topic, batching_enabled=False)
    holder = client.subscribe(topic, "holder")  # holds the data until compacted
    for i in range(10):
        producer.send(("v%d" % i).encode(), partition_key="k%d" % (i % 3))
    compact(srv, topic)
    holder.unsubscribe()
    # Retention deletes the ledgers the compaction horizon covers (the current one stays).
    eventually("compacted ledgers trimmed",
               lambda: len(_internal_stats(srv, topic)["ledgers"]) <= 2, deadline_s=30)
    expected = ["v7", "v8", "v9"]
    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    assert sorted(payloads(read_n(reader, 3))) == expected
    reader.close()
    producer.close()
    client.close()
    srv.restart()
    client = srv.client()
    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    assert sorted(payloads(read_n(reader, 3))) == expected
    assert_nothing_more(reader, wait_ms=1000)
    reader.close()
    client.close()


def test_compaction_threshold_starts_compaction_by_itself(compacting_server):
    srv = compacting_server
    client = srv.client()
    topic = unique_topic("compact-threshold")
    producer = client.create_producer(topic, batching_enabled=False)
    client.subscribe(topic, "holder")  # keeps the data from retention
    for i in range(20):
        producer.send(b"x" * 200, partition_key="k%d" % (i % 2))
    status, body = http_request("POST", _url(srv, topic, "compactionThreshold"), body=b"1024")
    assert status in (200, 204), (status, body)
    eventually("a compaction ran", lambda: _status(srv, topic)["status"] == "SUCCESS",
               deadline_s=30)
    assert _internal_stats(srv, topic)["compactedLedger"]["entries"] == 2
    producer.close()
    client.close()
