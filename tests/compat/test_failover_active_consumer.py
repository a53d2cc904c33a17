"""Failover subscriptions on raw frames: when ACTIVE_CONSUMER_CHANGE is sent.

Pulsar (AbstractDispatcherSingleActiveConsumer, PersistentDispatcherSingleActiveConsumer): the
active consumer of a partition is the consumers sorted by priority level and name, at index
partitionIndex % count. When it changes, the dispatcher waits activeConsumerFailoverDelayTimeMillis
(default 1000 ms) before it rewinds, notifies every consumer (ACTIVE_CONSUMER_CHANGE, is_active) and
dispatches. So a subscribing consumer gets its SUCCESS first and the notification afterwards;
clients only know the consumer id once SUCCESS arrived (the Go client drops an earlier
ACTIVE_CONSUMER_CHANGE: "Consumer not found while active consumer change").
tests/go/failover_listener_test.go checks the same through the Go client's EventListener."""

import json

import pytest

from compat_util import http_request, short_name, unique_topic
import pulsar_wire as wire
import raw_frames as raw

FAILOVER_DELAY_S = 1.0   # activeConsumerFailoverDelayTimeMillis default
SLACK_S = 0.1


def _change(fields):
    # CommandActiveConsumerChange: consumer_id 1, is_active 2 (default false)
    return fields[1][0], bool(fields.get(2, [0])[0])


def _success_then_change(watcher, label, request_id):
    """Asserts SUCCESS(request_id) arrived on `label` and an ACTIVE_CONSUMER_CHANGE after it;
    returns (consumer_id, is_active, seconds) of that change."""
    success = watcher.first(label, wire.SUCCESS)
    change = watcher.first(label, raw.ACTIVE_CONSUMER_CHANGE)
    assert success is not None, "no SUCCESS on %s: %s" % (label, watcher.describe())
    assert success[1][1] == [request_id], success
    assert change[0] > success[0], (
        "ACTIVE_CONSUMER_CHANGE before the SUBSCRIBE's SUCCESS on %s (clients do not know the "
        "consumer yet and drop it): %s" % (label, watcher.describe()))
    consumer_id, active = _change(change[1])
    return consumer_id, active, change[2]


def _has(label, type_):
    return lambda frames: any(t == type_ for t, _, _ in frames[label])


def _answered_and_told(label):
    """SUBSCRIBE answered (SUCCESS or ERROR) and an ACTIVE_CONSUMER_CHANGE seen, in any order."""
    return lambda f: ((_has(label, wire.SUCCESS)(f) or _has(label, wire.ERROR)(f))
                      and _has(label, raw.ACTIVE_CONSUMER_CHANGE)(f))


@pytest.mark.parametrize("domain", ["persistent", "non-persistent"])
def test_first_failover_consumer_is_told_active_after_success(server, domain):
    """Non-persistent topics too (their dispatcher notifies at once, without the hand-over
    delay, as Pulsar's NonPersistentDispatcherSingleActiveConsumer)."""
    topic = domain + "://" + unique_topic("fo-raw").split("://", 1)[1]
    with wire.RawConnection(server.service_url) as conn:
        conn.handshake()
        raw.lookup(conn, topic, 1)
        conn.send(raw.subscribe_frame(topic, "fo", 7, 2, raw.FAILOVER, "only"))
        w = raw.Watcher(c=conn)
        w.wait(_answered_and_told("c"), 10, "SUCCESS and ACTIVE_CONSUMER_CHANGE for the only consumer")
        assert w.first("c", wire.ERROR) is None, w.describe()
        consumer_id, active, _ = _success_then_change(w, "c", 2)
        assert consumer_id == 7 and active, "the only consumer must be told it is active"


def test_failover_switch_waits_for_the_failover_delay(server):
    topic = unique_topic("fo-raw-switch")
    status, body = http_request("PUT", "%s/admin/v2/persistent/public/default/%s/partitions"
                                % (server.web_url, short_name(topic)), json.dumps(1))
    assert 200 <= status < 300, (status, body)
    partition = topic + "-partition-0"
    with wire.RawConnection(server.service_url) as b, wire.RawConnection(server.service_url) as a:
        b.handshake()
        raw.lookup(b, partition, 1)
        b.send(raw.subscribe_frame(partition, "fo", 1, 2, raw.FAILOVER, "b-consumer"))
        wb = raw.Watcher(b=b)
        wb.wait(_answered_and_told("b"), 10, "b subscribed and told it is active")
        consumer_id, active, _ = _success_then_change(wb, "b", 2)
        assert consumer_id == 1 and active

        a.handshake()
        raw.lookup(a, partition, 1)
        # "a-consumer" sorts before "b-consumer": index 0 % 2 makes it the active one.
        a.send(raw.subscribe_frame(partition, "fo", 1, 2, raw.FAILOVER, "a-consumer"))
        w = raw.Watcher(a=a, b=b)
        w.wait(lambda f: _answered_and_told("a")(f) and _has("b", raw.ACTIVE_CONSUMER_CHANGE)(f),
               10, "a subscribed, and both consumers told about the new active consumer")
        consumer_id, active, at_a = _success_then_change(w, "a", 2)
        assert consumer_id == 1 and active, "a (sorted first) must become the active consumer"
        _, b_change, at_b = w.first("b", raw.ACTIVE_CONSUMER_CHANGE)
        assert _change(b_change) == (1, False), "b must be told it is no longer active"
        assert at_b >= FAILOVER_DELAY_S - SLACK_S, (
            "b was told it is inactive %.3f s after a subscribed; Pulsar switches after "
            "activeConsumerFailoverDelayTimeMillis (1000 ms): %s" % (at_b, w.describe()))
        assert at_a >= FAILOVER_DELAY_S - SLACK_S, (
            "a was told it is active %.3f s after subscribing; Pulsar switches after "
            "activeConsumerFailoverDelayTimeMillis (1000 ms): %s" % (at_a, w.describe()))
