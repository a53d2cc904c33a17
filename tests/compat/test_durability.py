"""Durability across a kill -9 and a graceful restart (managed server only)."""

import json
import threading

import pulsar
import pytest

from compat_util import (RECEIVE_TIMEOUT_MS, assert_nothing_more, drain, http_request, payloads,
                         read_n, receive_n, short_name, unique_topic)

pytestmark = pytest.mark.restarts_server


def _close_quietly(client):
    try:
        client.close()
    except Exception:  # the broker it talked to may be gone
        pass


def test_kill9_keeps_every_acknowledged_message(server):
    topic = unique_topic("dur-kill")
    n_pre = 100          # produced and consumed (and acked) before the crash
    n_total = 20_000     # upper bound of the stream the crash interrupts
    kill_after = 1_000   # broker acks (after the first n_pre) seen before kill -9

    c1 = server.client(operation_timeout_seconds=10)
    consumer = c1.subscribe(topic, "durable", consumer_type=pulsar.ConsumerType.Exclusive,
                            initial_position=pulsar.InitialPosition.Earliest)
    producer = c1.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=2,
                                  batching_max_messages=100, send_timeout_millis=5000,
                                  max_pending_messages=1000, block_if_queue_full=True)
    for i in range(n_pre):
        producer.send(("%d" % i).encode())
    pre = receive_n(consumer, n_pre)
    assert payloads(pre) == ["%d" % i for i in range(n_pre)]
    consumer.acknowledge_cumulative(pre[-1])  # one cumulative ack: 0 .. n_pre-1
    consumer.close()

    lock = threading.Lock()
    acked, failed = set(), set()
    enough = threading.Event()
    all_done = threading.Event()
    state = {"sent": 0, "finished": 0}

    def cb(i):
        def _cb(res, _msg_id):
            with lock:
                (acked if res == pulsar.Result.Ok else failed).add(i)
                state["finished"] += 1
                if len(acked) >= kill_after:
                    enough.set()
                if state["sent"] and state["finished"] == state["sent"]:
                    all_done.set()
        return _cb

    sent = 0
    killed = False
    for i in range(n_pre, n_total):
        producer.send_async(("%d" % i).encode(), cb(i))
        sent += 1
        if not killed and enough.is_set():
            server.kill()
            killed = True
            # keep the stream going a little: these are in flight when nothing listens
            for j in range(i + 1, min(i + 200, n_total)):
                producer.send_async(("%d" % j).encode(), cb(j))
                sent += 1
            break
    assert killed, "the broker acknowledged fewer than %d messages of %d" % (kill_after, sent)
    with lock:
        state["sent"] = sent
        if state["finished"] == sent:
            all_done.set()
    # nothing can be acknowledged while the broker is down: every pending send times out
    assert all_done.wait(60), "sends neither acknowledged nor failed 60 s after the crash"
    acked_at_crash = set(acked)
    assert acked_at_crash, "no acknowledged message before the crash"
    threading.Thread(target=_close_quietly, args=(c1,), daemon=True).start()

    server.start()  # same data dir and ports

    c2 = server.client()
    try:
        consumer = c2.subscribe(topic, "durable", consumer_type=pulsar.ConsumerType.Exclusive)
        got = [int(p) for p in payloads(drain(consumer, quiet_ms=3000, limit=n_total * 2))]
        print("sent %d, acknowledged by the broker %d, failed %d; received after restart %d"
              % (n_pre + sent, n_pre + len(acked_at_crash), len(failed), len(got)))
        assert not [x for x in got if x < n_pre], "messages acked before the crash came back"
        first_seen = []
        seen = set()
        for x in got:
            if x not in seen:
                seen.add(x)
                first_seen.append(x)
        lost = sorted(acked_at_crash - seen)
        assert not lost, "%d acknowledged messages lost, e.g. %r" % (len(lost), lost[:10])
        order = [x for x in first_seen if x in acked_at_crash]
        assert order == sorted(acked_at_crash), "acknowledged messages out of order"
        # the ones before the crash are still stored for a reader
        reader = c2.create_reader(topic, pulsar.MessageId.earliest)
        assert payloads(read_n(reader, n_pre)) == ["%d" % i for i in range(n_pre)]
        # the topic takes new messages after recovery and the subscription continues
        c2.create_producer(topic).send(b"after-recovery")
        tail = drain(consumer, quiet_ms=2000)
        assert payloads(tail)[-1:] == ["after-recovery"], payloads(tail)[-5:]
    finally:
        c2.close()


def test_graceful_restart_keeps_topics_messages_subscriptions(server):
    topic = unique_topic("dur-restart")
    late_topic = unique_topic("dur-late")
    part_topic = unique_topic("dur-part")
    part_url = "%s/admin/v2/persistent/public/default/%s/partitions" % (server.web_url,
                                                                       short_name(part_topic))
    status, body = http_request("PUT", part_url, body="3")
    assert 200 <= status < 300, (status, body)

    c1 = server.client()
    consumer = c1.subscribe(topic, "half", initial_position=pulsar.InitialPosition.Earliest)
    # no batching: acking some messages of a batch acks nothing until the whole batch is acked
    producer = c1.create_producer(topic, batching_enabled=False)
    for i in range(50):
        producer.send(("m-%d" % i).encode())
    msgs = receive_n(consumer, 50)
    for m in msgs[:20]:
        consumer.acknowledge(m)
    consumer.close()
    # a subscription created at "latest" before any message, then messages published to it
    late = c1.subscribe(late_topic, "late-sub")  # InitialPosition.Latest
    late.close()
    late_producer = c1.create_producer(late_topic)
    for i in range(5):
        late_producer.send(("late-%d" % i).encode())
    part_producer = c1.create_producer(part_topic)
    for i in range(9):
        part_producer.send(("p-%d" % i).encode())
    c1.close()

    assert server.stop(timeout=60), "the broker did not exit within 60 s of SIGTERM"
    server.start()

    c2 = server.client()
    try:
        # the subscription position survived: only the unacked 30 come back
        consumer = c2.subscribe(topic, "half")
        again = receive_n(consumer, 30)
        assert payloads(again) == ["m-%d" % i for i in range(20, 50)]
        assert_nothing_more(consumer)
        # all 50 messages are still stored
        reader = c2.create_reader(topic, pulsar.MessageId.earliest)
        assert payloads(read_n(reader, 50)) == ["m-%d" % i for i in range(50)]
        # the pre-existing "latest" subscription kept its position, so it gets what came after it
        late = c2.subscribe(late_topic, "late-sub")
        assert payloads(receive_n(late, 5)) == ["late-%d" % i for i in range(5)]
        # the partitioned topic is still partitioned and keeps its messages
        status, body = http_request("GET", part_url)
        assert status == 200 and json.loads(body)["partitions"] == 3, (status, body)
        part_reader = c2.subscribe(part_topic, "after",
                                   initial_position=pulsar.InitialPosition.Earliest)
        assert sorted(payloads(receive_n(part_reader, 9))) == sorted("p-%d" % i for i in range(9))
        # and new messages still flow on the old topic
        c2.create_producer(topic).send(b"after-restart")
        assert consumer.receive(timeout_millis=RECEIVE_TIMEOUT_MS).data() == b"after-restart"
    finally:
        c2.close()
