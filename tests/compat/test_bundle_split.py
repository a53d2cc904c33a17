"""Automatic bundle splits (Pulsar's `loadBalancerAutoBundleSplitEnabled`) on two brokers over
etcd (tests/compat/replicated_util.py), with `[load_manager] namespace_bundle_max_topics` low: a
namespace of one bundle whose topics pass the threshold is split by the leader, under load from
the official Python client, and the producer sees no error: every acknowledged send is consumed
once, in order (deduplication on); the namespace's bundles, as `namespaces bundles` shows them,
cover the full range afterwards.

Skipped without etcd unless MAGNETAR_REQUIRE_ETCD=1; skipped on an external broker."""

import json
import os
import threading
import time

import pulsar
import pytest

from compat_util import http_request, receive_n
from replicated_util import replicated_cluster, skip_unless_own_magnetar

pytestmark = pytest.mark.restarts_server

LOAD_MANAGER = "[load_manager]\ninterval_seconds = 1\nnamespace_bundle_max_topics = 4\n"
SPLIT_WITHIN_S = 30  # a few load-manager cycles of 1 s; bounds the test


def _bundles(broker, ns):
    status, body = http_request("GET", "%s/admin/v2/namespaces/%s/bundles" % (broker.web_url, ns))
    assert status == 200, (status, body)
    return json.loads(body)


def test_a_bundle_past_its_topic_threshold_is_split_under_load_without_a_send_error(
        tmp_path_factory):
    skip_unless_own_magnetar()
    with replicated_cluster(tmp_path_factory.mktemp("split")) as (_, _, start_broker):
        brokers = [start_broker("b%d" % i, LOAD_MANAGER) for i in range(2)]
        ns = "public/split-%d" % os.getpid()
        status, body = http_request("PUT", brokers[0].web_url + "/admin/v2/namespaces/" + ns,
                                    json.dumps({"bundles": {"numBundles": 1}}))
        assert status in (200, 204), (status, body)
        status, body = http_request("POST", "%s/admin/v2/namespaces/%s/deduplication"
                                    % (brokers[0].web_url, ns), "true")
        assert status in (200, 204), (status, body)
        assert _bundles(brokers[0], ns)["numBundles"] == 1

        url = "pulsar://" + ",".join(b.service_url[len("pulsar://"):] for b in brokers)
        client = pulsar.Client(url, operation_timeout_seconds=30)
        try:
            # Ten loaded topics in the one bundle: past the threshold of four.
            idle = [client.create_producer("persistent://%s/t-%d" % (ns, i)) for i in range(10)]
            topic = "persistent://%s/queue" % ns
            # The checker's subscription first, so that no closed ledger is trimmed before it.
            client.subscribe(topic, "check", initial_position=pulsar.InitialPosition.Earliest).close()
            producer = client.create_producer(topic, batching_enabled=False,
                                              send_timeout_millis=30000)
            acked, errors, stop = [], [], threading.Event()

            def send():
                i = 0
                while not stop.is_set():
                    try:
                        producer.send(b"%d" % i, sequence_id=i)
                        acked.append(i)
                    except Exception as error:  # noqa: BLE001: every error is a finding
                        errors.append(repr(error))
                    i += 1

            worker = threading.Thread(target=send)
            worker.start()
            try:
                deadline = time.monotonic() + SPLIT_WITHIN_S
                while _bundles(brokers[0], ns)["numBundles"] < 2:
                    assert time.monotonic() < deadline, "not split within %d s" % SPLIT_WITHIN_S
                    time.sleep(0.2)  # polled: the leader's cycle has no event to wait on
                after = len(acked)
                deadline = time.monotonic() + 30
                while len(acked) < after + 50:
                    assert time.monotonic() < deadline and worker.is_alive(), \
                        "no sends acknowledged after the split"
                    time.sleep(0.01)  # polled: the sending thread's progress
            finally:
                stop.set()
                worker.join(60)
            assert not errors, "send errors reached the application: %s" % errors[:5]
            bundles = _bundles(brokers[1], ns)
            assert bundles["boundaries"][0] == "0x00000000", bundles
            assert bundles["boundaries"][-1] == "0xffffffff", bundles
            assert bundles["numBundles"] == len(bundles["boundaries"]) - 1 >= 2, bundles
            consumer = client.subscribe(topic, "check")
            got = [int(m.data()) for m in receive_n(consumer, len(acked))]
            assert got == acked, "every acknowledged send once, in order"
            for p in idle:
                p.send(b"still served")  # each topic served on, by its bundle's owner
        finally:
            client.close()
        assert any("past a load threshold" in b.log_tail() for b in brokers)
