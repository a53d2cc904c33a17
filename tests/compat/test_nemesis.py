"""The nemesis suite (issue 48): the whole cluster under load from the official Python client,
beaten with random faults for MAGNETAR_NEMESIS_MINUTES (2 in the suite), then checked: no
acknowledged message lost, none stored twice (deduplication is on), each producer's order kept,
every acknowledged message consumed (no subscription stuck), every ledger back at its write
quorum. The run prints its seed (MAGNETAR_NEMESIS_SEED, else 1) and fault schedule; the same
seed replays the same schedule. `scripts/nemesis.sh --minutes 30 --seed S` is the long run.
See nemesis.py for the cluster, the faults and the checker, whose verdicts are tested here too.

Skipped without etcd unless MAGNETAR_REQUIRE_ETCD=1; skipped on an external broker."""

import http.client
import json
import os
import shutil
import time
import urllib.parse

import pytest

import nemesis
from compat_util import http_request
from replicated_util import skip_unless_own_magnetar

pytestmark = pytest.mark.restarts_server


# ----------------------------------------------------------------------- the checker's verdicts
def test_the_checker_finds_a_lost_a_duplicate_and_a_reordered_message():
    assert nemesis.check_topic(acked=[0, 1, 2], stored=[0, 1, 2], first_deliveries=[0, 1, 2]) == {}
    # A send that failed (3) may be stored or not; neither is a finding.
    assert nemesis.check_topic(acked=[0, 2], stored=[0, 1, 2, 3], first_deliveries=[0, 1, 2]) == {}
    found = nemesis.check_topic(acked=[0, 1, 2, 3], stored=[0, 2, 2, 1],
                                first_deliveries=[0, 2, 1])
    assert found["lost"] == [3]
    assert found["duplicates"] == [2]
    assert found["out_of_order"] == [(2, 1)]
    assert found["not_consumed"] == [3]
    assert found["delivered_out_of_order"] == [(2, 1)]


def test_the_ledger_check_finds_a_fragment_below_its_write_quorum():
    whole = {1: {"state": "CLOSED", "fragments": [{"ensemble": [1, 2, 3]}]}}
    assert nemesis.check_ledgers(whole, registered={1, 2, 3, 4}) == {}
    # Node 3 lost: node 4 could take its copy, so the fragment is a finding.
    assert nemesis.check_ledgers(whole, registered={1, 2, 4}) == {
        "below_write_quorum": [(1, 0, [1, 2, 3])]}
    # Every registered node holds a run of ledger 2 already: counted apart, not a finding.
    spread = {2: {"state": "CLOSED",
                  "fragments": [{"ensemble": [1, 2, 3]}, {"ensemble": [1, 2, 4]}]}}
    assert nemesis.check_ledgers(spread, registered={1, 2, 4}) == {
        "one_run_per_node": [(2, 0, [1, 2, 3])]}
    # Two fragments short of a node and one node free of the ledger: blocked as a whole.
    two = {4: {"state": "CLOSED",
               "fragments": [{"ensemble": [1, 2, 3]}, {"ensemble": [3, 2, 5]}]}}
    assert nemesis.check_ledgers(two, registered={1, 2, 5, 6}) == {
        "one_run_per_node": [(4, 0, [1, 2, 3]), (4, 1, [3, 2, 5])]}
    # An open ledger's fragments are its writer's: counted apart too.
    still_open = {3: {"state": "OPEN", "fragments": [{"ensemble": [1, 2, 3]}]}}
    assert nemesis.check_ledgers(still_open, registered={1, 2, 4}) == {
        "open": [(3, 0, [1, 2, 3])]}


def test_a_seed_draws_the_same_schedule_again_and_both_lanes_fill_the_run():
    first, again = nemesis.schedule(7, 120), nemesis.schedule(7, 120)
    assert first == again
    assert first != nemesis.schedule(8, 120)
    for lane in ("storage", "control"):
        faults = [f for f in first if f.lane == lane]
        assert len(faults) >= 6, faults
        # One fault at a time in a lane, each over before the run is.
        assert all(a.at + a.duration < b.at for a, b in zip(faults, faults[1:])), faults
        assert faults[-1].at + faults[-1].duration <= 120


def test_the_fault_proxy_cuts_stalls_and_heals():
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)

    def echo():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=lambda c=conn: _echo(c), daemon=True).start()

    threading.Thread(target=echo, daemon=True).start()
    proxy = nemesis.FaultProxy("127.0.0.1", 0, server.getsockname())
    host, port = "127.0.0.1", proxy._listener.getsockname()[1]
    try:
        conn = socket.create_connection((host, port), timeout=5)
        conn.sendall(b"a")
        assert conn.recv(1) == b"a"
        proxy.set("stall_answers")
        conn.sendall(b"b")
        conn.settimeout(0.5)
        with pytest.raises(socket.timeout):
            conn.recv(1)
        proxy.set("pass")
        conn.settimeout(5)
        assert conn.recv(1) == b"b", "the held answer arrives once the path heals"
        proxy.set("cut")
        assert conn.recv(1) == b"", "a cut closes the connection"
        fresh = socket.create_connection((host, port), timeout=5)
        assert fresh.recv(1) == b"", "and refuses new ones"
        proxy.set("pass")
        healed = socket.create_connection((host, port), timeout=5)
        healed.sendall(b"c")
        assert healed.recv(1) == b"c"
    finally:
        proxy.close()
        server.close()


def _echo(conn):
    try:
        while True:
            data = conn.recv(1024)
            if not data:
                return
            conn.sendall(data)
    except OSError:
        pass
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------- the run
def _keep_logs(cluster):
    keep = os.environ.get("MAGNETAR_TEST_KEEP_LOGS")
    if not keep:
        return
    os.makedirs(keep, exist_ok=True)
    for name, path in cluster.logs():
        if path and os.path.exists(path):
            shutil.copyfile(path, os.path.join(keep, "nemesis-%s.log" % name))


def _owner(cluster, topic):
    """The topic's owner as the first broker answers a lookup (its error if it cannot)."""
    try:
        status, body = http_request("GET", "%s/lookup/v2/topic/%s" % (
            cluster.brokers[0].web_url, topic.replace("://", "/")), timeout=10)
        return json.loads(body)["brokerUrl"] if status == 200 else "%d %r" % (status, body)
    except Exception as error:  # noqa: BLE001: a diagnostic only
        return repr(error)


def _unload(cluster, topic):
    """Unloads `topic` through the first broker, following its redirect to the owner."""
    url = "%s/admin/v2/%s/unload" % (cluster.brokers[0].web_url, topic.replace("://", "/"))
    for _ in range(3):
        parsed = urllib.parse.urlsplit(url)
        connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=120)
        try:
            connection.request("PUT", parsed.path)
            response = connection.getresponse()
            status, body = response.status, response.read()
            location = response.getheader("Location")
        finally:
            connection.close()
        if status != 307 or not location:
            return status, body
        url = location
    return status, body


MINUTES = float(os.environ.get("MAGNETAR_NEMESIS_MINUTES", "2"))
NOT_FAULTS = ("skipped", "node_start_failed")  # counted beside the faults


@pytest.mark.timeout(int(MINUTES * 60) + 600)  # the run, then bounded settling and checks
def test_nemesis_loses_nothing_duplicates_nothing_and_heals(tmp_path):
    skip_unless_own_magnetar()
    minutes = MINUTES
    # The suite replays one schedule (seed 1) so that a red run is a regression, not a new
    # draw; scripts/nemesis.sh draws a fresh seed unless given one.
    seed = int(os.environ.get("MAGNETAR_NEMESIS_SEED") or 1)
    seconds = minutes * 60
    faults = nemesis.schedule(seed, seconds)
    print("nemesis seed %d, %.1f minutes, %d faults scheduled "
          "(replay: scripts/nemesis.sh --minutes %g --seed %d)"
          % (seed, minutes, len(faults), minutes, seed))
    for fault in faults:
        print("  " + nemesis.describe(fault))

    cluster = nemesis.Cluster(str(tmp_path))
    loads, beater = [], None
    try:
        admin = cluster.brokers[0].web_url
        ns = "public/nemesis-%d" % os.getpid()
        for method, path, body in (
                ("PUT", "/admin/v2/namespaces/" + ns, json.dumps({"bundles": {"numBundles": 4}})),
                ("POST", "/admin/v2/namespaces/%s/deduplication" % ns, "true"),
                ("POST", "/admin/v2/namespaces/%s/retention" % ns,
                 json.dumps({"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}))):
            status, answer = http_request(method, admin + path, body)
            assert status in (200, 204), (path, status, answer)
        topics = ["persistent://%s/q-%d" % (ns, i) for i in range(nemesis.TOPICS)]
        loads = [nemesis.TopicLoad(cluster.service_url(), t, i) for i, t in enumerate(topics)]

        t0 = time.monotonic()
        beater = nemesis.Nemesis(cluster, faults, t0)
        beater.run()
        # Each fault is bounded: its hold, then a bounded restart.
        assert beater.wait_done(seconds + 120), "a fault did not finish healing"
        # Anything a failed heal left down is started again (on this thread, which outlives
        # the cluster: see Nemesis.stop); the run's errors still fail it below.
        beater.heal_all()
        faulted_s = time.monotonic() - t0

        for load in loads:
            assert load.stop_producing(nemesis.SEND_TIMEOUT_MS / 1000 + 10), \
                "%s: sends without an outcome" % load.topic
        deadline = time.monotonic() + nemesis.SETTLE_TIMEOUT_S
        while not all(load.consumed_everything_acked() for load in loads) \
                and time.monotonic() < deadline:
            time.sleep(0.2)  # the consumers' progress has no event to wait on
        consumed_s = time.monotonic() - t0 - faulted_s
        for load in loads:
            if not load.consumed_everything_acked():
                print("%s: %d acknowledged sends not consumed after %d s; owner %s"
                      % (load.topic, len(load.acked - load.seen), nemesis.SETTLE_TIMEOUT_S,
                         _owner(cluster, load.topic)))

        findings = {}
        for load in loads:
            try:
                stored = nemesis.stored_sequence(cluster.service_url(), load.topic)
            except Exception as error:  # noqa: BLE001: a topic that cannot be read is a finding
                findings[load.topic] = {"unreadable": "%r (owner %s)" % (
                    error, _owner(cluster, load.topic))}
                continue
            found = nemesis.check_topic(load.acked, stored, load.first_deliveries)
            if found:
                findings[load.topic] = found
            print("%s: sent %d, acknowledged %d, failed %d, stored %d, delivered %d "
                  "(%d redelivered), consumer errors %d"
                  % (load.topic.rsplit("/", 1)[1], load.sent, len(load.acked), len(load.failed),
                     len(stored), load.deliveries, load.deliveries - len(load.first_deliveries),
                     len(load.consume_errors)))
        for load in loads:
            load.close()
        loads = []

        # Every ledger back at its write quorum. An open ledger's earlier fragments are not
        # re-replicated yet (issue 48, ARCHITECTURE Known gaps): the topics are unloaded first,
        # which closes their ledgers, as a roll-over would.
        for topic in topics:
            status, body = _unload(cluster, topic)
            assert status in (200, 204), (topic, status, body)
        deadline = time.monotonic() + nemesis.SETTLE_TIMEOUT_S
        ledgers = nemesis.ledgers_whole(cluster.etcd)
        while "below_write_quorum" in ledgers and time.monotonic() < deadline:
            time.sleep(1)  # the auditor's rounds have no event to wait on
            ledgers = nemesis.ledgers_whole(cluster.etcd)
        if "below_write_quorum" in ledgers:
            findings["ledgers_below_write_quorum"] = ledgers["below_write_quorum"]
        blocked, still_open = ledgers.get("one_run_per_node", []), ledgers.get("open", [])
        print("ledgers: %d in etcd; fragments below their write quorum: %d with no replacement "
              "(one run of a ledger per node) %s, %d of ledgers still open %s (issue 48's known "
              "gaps)" % (len(nemesis.ledgers_in_etcd(cluster.etcd)), len(blocked), blocked[:5],
                         len(still_open), still_open[:5]))
        healed_s = time.monotonic() - t0 - faulted_s - consumed_s

        print("nemesis seed %d: %d faults applied over %.0f s (%s), %d skipped, %d node starts "
              "failed and tried again; consumed all %.1f s after, ledgers whole %.1f s after that"
              % (seed, sum(n for k, n in beater.counts.items() if k not in NOT_FAULTS),
                 faulted_s,
                 ", ".join("%s %d" % kv for kv in sorted(beater.counts.items())
                           if kv[0] not in NOT_FAULTS),
                 beater.counts["skipped"], beater.counts["node_start_failed"], consumed_s,
                 healed_s))
        assert not beater.errors, "faults that did not heal: %s" % beater.errors
        assert not findings, "seed %d: %s" % (seed, json.dumps(findings, default=str))
    finally:
        for load in loads:
            load.close()
        _keep_logs(cluster)
        cluster.close()
        if beater is not None:
            beater.stop()
