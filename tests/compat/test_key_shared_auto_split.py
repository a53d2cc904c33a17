"""Key_Shared AUTO_SPLIT with the hash-range auto-split selector, on a broker of its own.

Pulsar selects with HashRangeAutoSplitStickyKeyConsumerSelector when
subscriptionKeySharedUseConsistentHashing=false: the first consumer owns the whole hash range
(0, 65536]; each joining consumer takes the lower half of the currently largest range (the range
map is {range end -> consumer}; a join adds end - (end - start) / 2 for the new consumer), and a
key with sticky hash h goes to the consumer of the smallest range end >= h. With consumers joining
in the order c1, c2, c3:
    c1 alone:          (0, 65536] -> c1
    c2 joins:          (0, 32768] -> c2, (32768, 65536] -> c1
    c3 joins:          (0, 16384] -> c3, (16384, 32768] -> c2, (32768, 65536] -> c1
(the largest range is the first one found in key order, so c3 splits c2's range).

Magnetar's setting for it: `[broker] key_shared_use_consistent_hashing = false` in the TOML
file given with `--config`. The fixture starts such a broker. Against another broker (e.g. real
Pulsar), MAGNETAR_TEST_AUTO_SPLIT_SERVER_CMD gives its command line, with the {broker_port},
{web_port} and {data_dir} placeholders of MAGNETAR_TEST_SERVER_CMD, for a broker configured with
subscriptionKeySharedUseConsistentHashing=false."""

import os
import shlex
import shutil
import time

import pulsar
import pytest

import conftest
from compat_util import RECEIVE_TIMEOUT_MS, assert_nothing_more, unique_topic
from test_key_shared import sticky_hash

AUTO_SPLIT_TOML = """\
# written by tests/compat/test_key_shared_auto_split.py
[broker]
key_shared_use_consistent_hashing = false
"""

# Which consumer owns which sticky hashes, by number of consumers (joined in this order).
RANGES = {
    2: [("c2", 1, 32768), ("c1", 32769, 65535)],
    3: [("c3", 1, 16384), ("c2", 16385, 32768), ("c1", 32769, 65535)],
}
KEYS_PER_CONSUMER = 4
MESSAGES_PER_KEY = 3


@pytest.fixture(scope="module")
def auto_split_server():
    if os.environ.get("MAGNETAR_TEST_SERVICE_URL"):
        pytest.skip("needs a broker of its own (with the auto-split selector); "
                    "MAGNETAR_TEST_SERVICE_URL is set")
    template = os.environ.get("MAGNETAR_TEST_AUTO_SPLIT_SERVER_CMD")
    if os.environ.get("MAGNETAR_TEST_SERVER_CMD") and not template:
        pytest.skip("MAGNETAR_TEST_SERVER_CMD is set: give the command line of a broker with "
                    "subscriptionKeySharedUseConsistentHashing=false in "
                    "MAGNETAR_TEST_AUTO_SPLIT_SERVER_CMD")
    srv = conftest.Server()
    if template:
        srv.cmd = [a.format(broker_port=srv.broker_port, web_port=srv.web_port,
                            data_dir=srv.data_dir) for a in shlex.split(template)]
        if "/" in srv.cmd[0] and not os.path.isabs(srv.cmd[0]):
            srv.cmd[0] = os.path.join(conftest.REPO_ROOT, srv.cmd[0])
    else:
        config = os.path.join(srv._tmp, "auto-split.toml")
        with open(config, "w") as f:
            f.write(AUTO_SPLIT_TOML)
        srv.cmd += ["--config", config]
    try:
        srv.start()  # its error carries the server log
    except BaseException:
        srv.close()
        shutil.rmtree(srv._tmp, ignore_errors=True)
        raise
    try:
        yield srv
    finally:
        srv.close()
        shutil.rmtree(srv._tmp, ignore_errors=True)


def _keys_for(ranges):
    """KEYS_PER_CONSUMER keys per consumer whose sticky hashes fall well inside its range."""
    want = {name: [] for name, _, _ in ranges}
    i = 0
    while any(len(keys) < KEYS_PER_CONSUMER for keys in want.values()):
        key = "key-%d" % i
        i += 1
        h = sticky_hash(key)
        for name, lo, hi in ranges:
            if lo + 8 <= h <= hi - 8 and len(want[name]) < KEYS_PER_CONSUMER:
                want[name].append(key)
    return want


@pytest.mark.parametrize("n", sorted(RANGES), ids=lambda n: "%d-consumers" % n)
def test_each_new_consumer_takes_half_of_the_largest_range(auto_split_server, n):
    ranges = RANGES[n]
    topic = unique_topic("ks-autosplit")
    client = auto_split_server.client()
    try:
        consumers = {}
        for i in range(1, n + 1):  # c1 first, then c2, ...: the join order decides the split
            consumers["c%d" % i] = client.subscribe(
                topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared,
                consumer_name="c%d" % i, initial_position=pulsar.InitialPosition.Earliest)
        want = _keys_for(ranges)
        producer = client.create_producer(topic, batching_enabled=False)
        total = 0
        for round_ in range(MESSAGES_PER_KEY):
            for keys in want.values():
                for key in keys:
                    producer.send(("%s/%d" % (key, round_)).encode(), partition_key=key)
                    total += 1

        got = {name: set() for name in consumers}
        count = 0
        deadline = time.monotonic() + RECEIVE_TIMEOUT_MS / 1000 * 2
        while count < total:
            assert time.monotonic() < deadline, (
                "received %d of %d messages; keys so far %r" % (count, total, got))
            for name, consumer in consumers.items():
                try:
                    msg = consumer.receive(timeout_millis=50)
                except pulsar.Timeout:
                    continue
                got[name].add(msg.partition_key())
                consumer.acknowledge(msg)
                count += 1
        for consumer in consumers.values():
            assert_nothing_more(consumer)

        expected = {name: set(keys) for name, keys in want.items()}
        assert all(got.values()), "a consumer got no key at all: %r (expected %r)" % (got, expected)
        assert got == expected, (
            "keys per consumer %r, want %r (hashes: %r)"
            % (got, expected, {k: sticky_hash(k) for keys in want.values() for k in keys}))
    finally:
        client.close()
