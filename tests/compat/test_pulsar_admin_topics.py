"""Topic operations through Apache's own `pulsar-admin` CLI (pulsar-client-tools 4.0.8), with
data produced and consumed by the official Python client:

  topics stats / stats-internal / partitioned-stats / partitioned-stats-internal,
  subscriptions / create-subscription / unsubscribe, peek-messages (batched too),
  examine-message, get-message-by-id, last-message-id, skip / clear-backlog,
  reset-cursor (by time and by message id), unload, terminate, lookup, properties.

The tests share topics where they can (each command is still a fraction of a second).
"""

import json
import time

import pulsar
import pytest

from compat_util import http_request, receive_n, short_name, unique_topic
from pulsar_admin import PulsarAdmin, requires_pulsar_admin

pytestmark = requires_pulsar_admin

N = 10


@pytest.fixture(scope="module")
def admin(server):
    return PulsarAdmin(server.web_url)


@pytest.fixture(scope="module")
def client(server):
    c = server.client()
    yield c
    c.close()


def produce(client, topic, n, prefix="m", batched=False, properties=None):
    kwargs = {"batching_enabled": True, "batching_max_messages": n,
              "batching_max_publish_delay_ms": 50} if batched else {"batching_enabled": False}
    producer = client.create_producer(topic, **kwargs)
    ids = []
    if batched:
        done = []
        for i in range(n):
            producer.send_async(("%s-%d" % (prefix, i)).encode(),
                                lambda res, mid: done.append((res, mid)),
                                properties=properties or {})
        producer.flush()
        deadline = time.time() + 10
        while len(done) < n and time.time() < deadline:
            time.sleep(0.01)
        assert len(done) == n and all(r == pulsar.Result.Ok for r, _ in done), done
        ids = [m for _, m in done]
    else:
        for i in range(n):
            ids.append(producer.send(("%s-%d" % (prefix, i)).encode(),
                                     properties=properties or {}))
    producer.close()
    return ids


def rest(server, topic, op, method="GET"):
    """One admin REST call on the topic (faster than a CLI JVM for repeated checks)."""
    domain, rest_of = topic.split("://", 1)
    status, body = http_request(method, "%s/admin/v2/%s/%s/%s" % (server.web_url, domain, rest_of,
                                                                   op))
    assert 200 <= status < 300, (op, status, body)
    return json.loads(body) if body else None


def stats(server, topic):
    return rest(server, topic, "stats")


def sub_stats(server, topic, sub):
    return stats(server, topic)["subscriptions"][sub]


def lines(out):
    return [line.strip() for line in out.splitlines() if line.strip()]


def wait_for(check, timeout=10, what="condition"):
    deadline = time.time() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.time() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.2)


def test_stats_subscriptions_peek_skip_clear_and_reset(admin, client, server):
    topic = unique_topic("adm-ops")
    # A subscription before the data, so it has a backlog of all N.
    admin("topics", "create", topic)
    admin("topics", "create-subscription", "-s", "sub", topic)
    assert lines(admin("topics", "subscriptions", topic)) == ["sub"]
    ids = produce(client, topic, N, properties={"k": "v"})

    st = admin.json("topics", "stats", topic)
    assert st["msgInCounter"] == N, st
    assert st["bytesInCounter"] > 0 and st["storageSize"] > 0, st
    assert st["backlogSize"] > 0, st
    sub = st["subscriptions"]["sub"]
    assert sub["msgBacklog"] == N and sub["msgBacklogNoDelayed"] == N, sub
    assert sub["isDurable"] is True and sub["consumers"] == [], sub

    internal = admin.json("topics", "stats-internal", topic)
    assert internal["numberOfEntries"] == N, internal
    assert internal["entriesAddedCounter"] == N, internal
    assert internal["state"] == "LedgerOpened", internal
    last = ids[-1]
    assert internal["lastConfirmedEntry"] == "%d:%d" % (last.ledger_id(), last.entry_id())
    assert sum(l["entries"] for l in internal["ledgers"]) == N, internal["ledgers"]
    cursor = internal["cursors"]["sub"]
    assert cursor["markDeletePosition"].endswith(":-1"), cursor
    assert cursor["individuallyDeletedMessages"] == "[]", cursor

    # Peek: the first three, in order, with the message id and the property.
    out = admin("topics", "peek-messages", "-s", "sub", "-n", "3", topic)
    for i in range(3):
        assert "m-%d" % i in out, out
    assert "m-3" not in out, out
    first = ids[0]
    assert "%d:%d" % (first.ledger_id(), first.entry_id()) in out, out

    # Examine and get-message-by-id.
    out = admin("topics", "examine-messages", "-i", "earliest", "-m", "2", topic)
    assert "m-1" in out, out
    out = admin("topics", "examine-messages", "-i", "latest", "-m", "1", topic)
    assert "m-%d" % (N - 1) in out, out
    mid = ids[4]
    out = admin("topics", "get-message-by-id", "-l", mid.ledger_id(), "-e", mid.entry_id(), topic)
    assert "m-4" in out, out
    out = admin("topics", "last-message-id", topic)
    assert str(last.ledger_id()) in out and str(last.entry_id()) in out, out

    # A consumer acks two individually (holes in the cursor), then skip and clear-backlog.
    consumer = client.subscribe(topic, "sub", consumer_name="c1")
    got = receive_n(consumer, N)
    consumer.acknowledge(got[1])
    consumer.acknowledge(got[3])
    st = wait_for(lambda: (lambda s: s if s["subscriptions"]["sub"]["msgBacklog"] == N - 2
                           else None)(stats(server, topic)),
                  what="backlog N-2 after two acks")
    sub = st["subscriptions"]["sub"]
    assert sub["unackedMessages"] == N - 2, sub
    assert [c["consumerName"] for c in sub["consumers"]] == ["c1"], sub
    assert sub["msgOutCounter"] == N and st["msgOutCounter"] == N, sub
    assert sub["type"] == "Exclusive", sub
    internal = rest(server, topic, "internalStats")
    holes = internal["cursors"]["sub"]["individuallyDeletedMessages"]
    assert holes.count("..") == 2, holes
    consumer.close()

    admin("topics", "skip", "-s", "sub", "-n", "3", topic)
    assert sub_stats(server, topic, "sub")["msgBacklog"] == N - 5
    # Peek now starts after what was skipped and acked: m-0,1,2,3,4 are gone.
    out = admin("topics", "peek-messages", "-s", "sub", "-n", "1", topic)
    assert "m-5" in out, out
    admin("topics", "clear-backlog", "-s", "sub", topic)
    assert sub_stats(server, topic, "sub")["msgBacklog"] == 0

    # Reset by message id: the subscription gets m-6.. again.
    six = ids[6]
    admin("topics", "reset-cursor", "-s", "sub", "-m", "%d:%d" % (six.ledger_id(), six.entry_id()),
          topic)
    assert sub_stats(server, topic, "sub")["msgBacklog"] == N - 6
    consumer = client.subscribe(topic, "sub")
    got = receive_n(consumer, N - 6)
    assert [m.data().decode() for m in got] == ["m-%d" % i for i in range(6, N)]
    consumer.close()

    # Reset by time (a relative time: everything from the last 10 minutes): all of it again.
    admin("topics", "reset-cursor", "-s", "sub", "-t", "10m", topic)
    assert sub_stats(server, topic, "sub")["msgBacklog"] == N
    consumer = client.subscribe(topic, "sub")
    got = receive_n(consumer, N)
    assert [m.data().decode() for m in got] == ["m-%d" % i for i in range(N)]
    consumer.close()

    # Subscriptions: create at earliest, errors, unsubscribe.
    admin("topics", "create-subscription", "-s", "early", "-m", "earliest", topic)
    assert sub_stats(server, topic, "early")["msgBacklog"] == N
    admin("topics", "create-subscription", "-s", "late", topic)
    assert sub_stats(server, topic, "late")["msgBacklog"] == 0
    res = admin.run("topics", "create-subscription", "-s", "late", topic)
    assert res.returncode != 0 and "already exists" in (res.stdout + res.stderr), res
    assert sorted(rest(server, topic, "subscriptions")) == ["early", "late", "sub"]
    holder = client.subscribe(topic, "early")
    res = admin.run("topics", "unsubscribe", "-s", "early", topic)
    assert res.returncode != 0 and "consumers" in (res.stdout + res.stderr), res
    holder.close()
    admin("topics", "unsubscribe", "-f", "-s", "early", topic)
    admin("topics", "unsubscribe", "-s", "late", topic)
    assert rest(server, topic, "subscriptions") == ["sub"]
    res = admin.run("topics", "unsubscribe", "-s", "nope", topic)
    assert res.returncode != 0 and "not found" in (res.stdout + res.stderr).lower(), res

    # Missing topic: 404.
    status, body = http_request("GET", server.web_url + "/admin/v2/persistent/public/default/%s/stats"
                                % short_name(unique_topic("missing")))
    assert status == 404, (status, body)


def test_peek_batched_messages(admin, client, server):
    topic = unique_topic("adm-peek-batch")
    client.subscribe(topic, "sub").close()
    produce(client, topic, 5, prefix="b", batched=True)
    out = admin("topics", "peek-messages", "-s", "sub", "-n", "5", topic)
    for i in range(5):
        assert "b-%d" % i in out, out
    # Each message of the batch is listed with its batch index (ledger:entry:-1:index or
    # ledger:entry:index, as the CLI renders batch ids).
    assert out.count("Message ID") >= 5 or out.count("Batch Message ID") >= 5, out
    st = stats(server, topic)
    assert st["msgInCounter"] == 5, st
    assert st["subscriptions"]["sub"]["msgBacklog"] >= 1


def test_partitioned_stats_and_fan_out(admin, client, server):
    topic = unique_topic("adm-part")
    admin("topics", "create-partitioned-topic", "-p", "3", topic)
    admin("topics", "create-subscription", "-s", "sub", topic)
    producer = client.create_producer(topic, batching_enabled=False,
                                      message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
    for i in range(9):
        producer.send(("p-%d" % i).encode())
    producer.close()
    st = admin.json("topics", "partitioned-stats", "--per-partition", topic)
    assert st["msgInCounter"] == 9, st
    assert st["metadata"]["partitions"] == 3, st
    assert len(st["partitions"]) == 3, st
    assert sum(p["msgInCounter"] for p in st["partitions"].values()) == 9
    assert st["subscriptions"]["sub"]["msgBacklog"] == 9, st["subscriptions"]
    internal = admin.json("topics", "partitioned-stats-internal", topic)
    assert internal["metadata"]["partitions"] == 3, internal
    assert sum(p["numberOfEntries"] for p in internal["partitions"].values()) == 9, internal
    assert rest(server, topic, "subscriptions") == ["sub"]
    admin("topics", "clear-backlog", "-s", "sub", topic)
    st = rest(server, topic, "partitioned-stats")
    assert st["subscriptions"]["sub"]["msgBacklog"] == 0, st["subscriptions"]
    # Peek on the partitioned topic's name is refused (405), as in Pulsar.
    res = admin.run("topics", "peek-messages", "-s", "sub", topic)
    assert res.returncode != 0, res


def test_unload_keeps_clients_working(admin, client, server):
    topic = unique_topic("adm-unload")
    producer = client.create_producer(topic, batching_enabled=False)
    consumer = client.subscribe(topic, "sub")
    producer.send(b"before")
    consumer.acknowledge(receive_n(consumer, 1)[0])
    time.sleep(0.5)  # the client sends acks in groups
    admin("topics", "unload", topic)
    # Both reconnect and carry on (nothing acknowledged comes back).
    producer.send(b"after")
    msg = receive_n(consumer, 1)[0]
    assert msg.data() == b"after"
    consumer.acknowledge(msg)
    st = stats(server, topic)
    assert len(st["publishers"]) == 1 and st["publishers"][0]["producerName"], st
    assert st["publishers"][0]["address"].startswith("/"), st["publishers"]
    assert len(st["subscriptions"]["sub"]["consumers"]) == 1, st
    producer.close()
    consumer.close()


def test_terminate(admin, client, server):
    topic = unique_topic("adm-term")
    producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=5000)
    consumer = client.subscribe(topic, "sub")
    for i in range(3):
        producer.send(("t-%d" % i).encode())
    out = admin("topics", "terminate", topic)
    assert "terminated" in out.lower(), out
    with pytest.raises(Exception) as failed:
        producer.send(b"too late")
    assert "terminat" in str(failed.value).lower() or "Terminated" in type(failed.value).__name__, \
        failed.value
    # A new producer is refused too.
    with pytest.raises(Exception):
        client.create_producer(topic)
    got = receive_n(consumer, 3)
    for m in got:
        consumer.acknowledge(m)
    # The end of the topic: a reader has nothing more and the consumer hears of it.
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    for _ in range(3):
        reader.read_next(10_000)
    assert not reader.has_message_available()
    reader.close()
    internal = admin.json("topics", "stats-internal", topic)
    assert internal["state"] == "Terminated", internal
    # Kept across an unload (the state is stored).
    rest(server, topic, "unload", method="PUT")
    assert rest(server, topic, "internalStats")["state"] == "Terminated"
    consumer.close()


def test_lookup_and_properties(admin, server):
    topic = unique_topic("adm-lookup")
    admin("topics", "create", topic)
    out = admin("topics", "lookup", topic)
    assert server.service_url in out, out
    admin("topics", "update-properties", "-p", "a=1", "-p", "b=2", topic)
    out = admin("topics", "get-properties", topic)
    assert dict(line.split() for line in lines(out)) == {"a": "1", "b": "2"}, out
    admin("topics", "remove-properties", "-k", "a", topic)
    assert rest(server, topic, "properties") == {"b": "2"}


def test_non_persistent_stats(admin, client, server):
    topic = "non-persistent://public/default/adm-np-" + short_name(unique_topic("x"))
    consumer = client.subscribe(topic, "sub")
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(4):
        producer.send(b"x")
    receive_n(consumer, 4)
    st = admin.json("topics", "stats", topic)
    assert st["msgInCounter"] == 4, st
    assert st["subscriptions"]["sub"]["msgOutCounter"] == 4, st
    assert rest(server, topic, "subscriptions") == ["sub"]
    producer.close()
    consumer.close()
