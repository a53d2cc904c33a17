"""Many topics at once on one client connection."""

import threading

import pulsar

from compat_util import payloads, receive_n, unique_topic

N_TOPICS = 50
PER_TOPIC = 20


def test_fifty_topics_at_once(client):
    topics = [unique_topic("many-%02d" % t) for t in range(N_TOPICS)]
    consumers = [client.subscribe(t, "sub", initial_position=pulsar.InitialPosition.Earliest)
                 for t in topics]
    producers = [client.create_producer(t, batching_enabled=(i % 2 == 0))
                 for i, t in enumerate(topics)]

    lock = threading.Lock()
    done = threading.Event()
    state = {"left": N_TOPICS * PER_TOPIC, "errors": []}

    def cb(res, _msg_id):
        with lock:
            if res != pulsar.Result.Ok:
                state["errors"].append(res)
            state["left"] -= 1
            if state["left"] == 0:
                done.set()

    # interleave topics so that all producers are busy at the same time
    for i in range(PER_TOPIC):
        for t, p in enumerate(producers):
            p.send_async(("t%d-m%d" % (t, i)).encode(), cb)
    for p in producers:
        p.flush()
    assert done.wait(60), "%d sends still pending" % state["left"]
    assert not state["errors"], state["errors"][:5]

    for t, c in enumerate(consumers):
        msgs = receive_n(c, PER_TOPIC)
        assert payloads(msgs) == ["t%d-m%d" % (t, i) for i in range(PER_TOPIC)], "topic %d" % t
        assert all(m.topic_name() == topics[t] for m in msgs)
        c.acknowledge_cumulative(msgs[-1])
