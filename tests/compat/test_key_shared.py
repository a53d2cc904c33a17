"""Key_Shared subscriptions: keys split across consumers (AUTO_SPLIT consistent hashing), STICKY
hash ranges, key-based batches, and per-key order while consumers join and leave."""

import queue
import threading
import time

import pulsar
import pytest

from compat_util import unique_topic

RANGE_SIZE = 65536


def murmur3_32(data, seed=0):
    """MurmurHash3 x86 32-bit, as Pulsar's Murmur3_32Hash."""
    c1, c2 = 0xCC9E2D51, 0x1B873593
    mask = 0xFFFFFFFF
    h = seed
    n = len(data) // 4 * 4
    for i in range(0, n, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * c1) & mask
        k = ((k << 15) | (k >> 17)) & mask
        k = (k * c2) & mask
        h ^= k
        h = ((h << 13) | (h >> 19)) & mask
        h = (h * 5 + 0xE6546B64) & mask
    tail = data[n:]
    if tail:
        k = int.from_bytes(tail, "little")
        k = (k * c1) & mask
        k = ((k << 15) | (k >> 17)) & mask
        k = (k * c2) & mask
        h ^= k
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & mask
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & mask
    h ^= h >> 16
    return h


def sticky_hash(key):
    """Pulsar 4's sticky key hash: Murmur3 (sign bit cleared) mod 65536, 0 mapped to 1."""
    value = (murmur3_32(key.encode()) & 0x7FFFFFFF) % RANGE_SIZE
    return value or 1


class Recorder:
    """Listener for several consumers: records (consumer, key, seq) in a global order, then acks
    (record before ack: the broker cannot hand the key to another consumer before the ack, so
    the recorded order respects what the broker did)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.events = []
        self.arrived = threading.Condition(self.lock)
        self.seen = set()

    def listener(self, name):
        def on_message(consumer, msg):
            seq = int(msg.data().decode())
            with self.lock:
                self.events.append((name, msg.partition_key(), seq))
                self.seen.add(seq)
                self.arrived.notify_all()
            consumer.acknowledge(msg)
        return on_message

    def wait_for(self, count, timeout_s):
        deadline = time.monotonic() + timeout_s
        with self.lock:
            while len(self.seen) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(set(range(count)) - self.seen)
                    raise AssertionError("%d of %d messages arrived; missing e.g. %r"
                                         % (len(self.seen), count, missing[:10]))
                self.arrived.wait(left)

    def assert_per_key_order(self):
        with self.lock:
            events = list(self.events)
        last = {}
        first_seen = set()
        for name, key, seq in events:
            if seq in first_seen:
                continue  # a redelivery of something a closed consumer had not acknowledged
            first_seen.add(seq)
            assert seq > last.get(key, -1), \
                "key %s: %d arrived (at %s) after %d" % (key, seq, name, last[key])
            last[key] = seq

    def owners(self):
        with self.lock:
            result = {}
            for name, key, _seq in self.events:
                result.setdefault(key, set()).add(name)
            return result


def _subscribe(client, topic, name, recorder, policy=None, sub="ks"):
    kwargs = {}
    if policy is not None:
        kwargs["key_shared_policy"] = policy
    return client.subscribe(topic, sub, consumer_type=pulsar.ConsumerType.KeyShared,
                            consumer_name=name, message_listener=recorder.listener(name),
                            initial_position=pulsar.InitialPosition.Earliest, **kwargs)


def test_keys_are_split_and_each_key_goes_to_one_consumer(client):
    topic = unique_topic("ks-split")
    rec = Recorder()
    consumers = [_subscribe(client, topic, "c%d" % i, rec) for i in range(3)]
    producer = client.create_producer(topic, batching_enabled=False)
    n = 300
    for i in range(n):
        producer.send(str(i).encode(), partition_key="key-%d" % (i % 30))
    rec.wait_for(n, 30)
    owners = rec.owners()
    assert all(len(names) == 1 for names in owners.values()), owners
    used = set().union(*owners.values())
    assert len(used) >= 2, "30 keys over 3 consumers all went to %r" % used
    rec.assert_per_key_order()
    for c in consumers:
        c.close()


def test_messages_without_key_go_to_one_consumer(client):
    topic = unique_topic("ks-nokey")
    rec = Recorder()
    consumers = [_subscribe(client, topic, "c%d" % i, rec) for i in range(3)]
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(50):
        producer.send(str(i).encode())
    rec.wait_for(50, 30)
    with rec.lock:
        names = {name for name, _key, _seq in rec.events}
        seqs = [seq for _name, _key, seq in rec.events]
    assert len(names) == 1
    assert seqs == list(range(50))
    for c in consumers:
        c.close()


def in_domain(topic, domain):
    """`topic` (persistent://...) in `domain`: Key_Shared routes the same on non-persistent
    topics (Pulsar's non-persistent dispatcher uses the same selectors)."""
    return domain + "://" + topic.split("://", 1)[1]


@pytest.mark.parametrize("domain", ["persistent", "non-persistent"])
def test_sticky_ranges_are_honoured(client, domain):
    topic = in_domain(unique_topic("ks-sticky"), domain)
    rec = Recorder()
    # The upper range joins first: splitting the hash space in join order would not honour it.
    ranges = {"high": [(32768, 65535)], "low": [(0, 32767)]}
    consumers = [
        _subscribe(client, topic, name, rec, pulsar.ConsumerKeySharedPolicy(
            key_shared_mode=pulsar.KeySharedMode.Sticky, sticky_ranges=r))
        for name, r in ranges.items()
    ]
    producer = client.create_producer(topic, batching_enabled=False)
    n = 200
    for i in range(n):
        producer.send(str(i).encode(), partition_key="key-%d" % i)
    rec.wait_for(n, 30)
    with rec.lock:
        events = list(rec.events)
    for name, key, _seq in events:
        hash_value = sticky_hash(key)
        assert any(lo <= hash_value <= hi for lo, hi in ranges[name]), (name, key, hash_value)
    assert {name for name, _k, _s in events} == {"low", "high"}
    for c in consumers:
        c.close()


@pytest.mark.parametrize("domain", ["persistent", "non-persistent"])
def test_overlapping_sticky_ranges_are_refused(client, domain):
    topic = in_domain(unique_topic("ks-overlap"), domain)
    rec = Recorder()
    sticky = pulsar.KeySharedMode.Sticky
    first = _subscribe(client, topic, "a", rec, pulsar.ConsumerKeySharedPolicy(
        key_shared_mode=sticky, sticky_ranges=[(0, 1000)]))
    with pytest.raises(pulsar.ConsumerAssignError):
        _subscribe(client, topic, "b", rec, pulsar.ConsumerKeySharedPolicy(
            key_shared_mode=sticky, sticky_ranges=[(500, 2000)]))
    # a disjoint range is fine
    second = _subscribe(client, topic, "c", rec, pulsar.ConsumerKeySharedPolicy(
        key_shared_mode=sticky, sticky_ranges=[(1001, 2000)]))
    first.close()
    second.close()


def test_key_based_batches_are_routed_by_key(client):
    topic = unique_topic("ks-batch")
    rec = Recorder()
    consumers = [_subscribe(client, topic, "c%d" % i, rec) for i in range(2)]
    producer = client.create_producer(topic, batching_enabled=True,
                                      batching_type=pulsar.BatchingType.KeyBased,
                                      batching_max_publish_delay_ms=20)
    n = 400
    done = threading.Semaphore(0)
    for i in range(n):
        producer.send_async(str(i).encode(), lambda res, _id: done.release(),
                            partition_key="key-%d" % (i % 10))
    producer.flush()
    rec.wait_for(n, 30)
    owners = rec.owners()
    assert all(len(names) == 1 for names in owners.values()), owners
    rec.assert_per_key_order()
    for c in consumers:
        c.close()


def test_allow_out_of_order_delivery_still_delivers_everything(client):
    topic = unique_topic("ks-ooo")
    rec = Recorder()
    policy = pulsar.ConsumerKeySharedPolicy(allow_out_of_order_delivery=True)
    consumers = [_subscribe(client, topic, "c%d" % i, rec, policy) for i in range(2)]
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(100):
        producer.send(str(i).encode(), partition_key="key-%d" % (i % 7))
    rec.wait_for(100, 30)
    assert all(len(names) == 1 for names in rec.owners().values())
    for c in consumers:
        c.close()


def test_consumers_join_and_leave_while_a_producer_sends(client, server):
    """Every message arrives, each key's messages in order, and nothing stalls (bounded)."""
    topic = unique_topic("ks-churn")
    rec = Recorder()
    other = server.client()
    try:
        consumers = {"c0": _subscribe(client, topic, "c0", rec)}
        producer = client.create_producer(topic, batching_enabled=False)
        n = 3000
        errors = queue.Queue()

        def produce():
            try:
                for i in range(n):
                    producer.send_async(str(i).encode(),
                                        lambda res, _id: res == pulsar.Result.Ok or errors.put(res),
                                        partition_key="key-%d" % (i % 40))
                    if i % 100 == 99:
                        producer.flush()
                        time.sleep(0.02)  # pacing only: spreads the stream over the churn
                producer.flush()
            except Exception as e:  # surfaced below
                errors.put(e)

        thread = threading.Thread(target=produce)
        thread.start()
        rec.wait_for(200, 30)
        consumers["c1"] = _subscribe(other, topic, "c1", rec)
        rec.wait_for(800, 30)
        consumers["c2"] = _subscribe(client, topic, "c2", rec)
        rec.wait_for(1400, 30)
        consumers.pop("c0").close()
        rec.wait_for(2000, 30)
        consumers["c3"] = _subscribe(other, topic, "c3", rec)
        consumers.pop("c1").close()
        thread.join(60)
        assert not thread.is_alive()
        assert errors.empty(), errors.get()
        rec.wait_for(n, 60)
        rec.assert_per_key_order()
        for c in consumers.values():
            c.close()
    finally:
        other.close()
