"""Producers that bring no name get one unique across the cluster and across restarts, as
Pulsar's `<cluster>-<instance>-<n>` (its instance number from a counter in the metadata store):
deduplication is keyed on producer names, so two brokers, or one broker before and after a
restart, must never hand out the same one."""

import re

import conftest
from compat_util import unique_topic

NAME = re.compile(r"^standalone-(\d+)-(\d+)$")


def _names(client, count):
    topic = unique_topic("names")
    producers = [client.create_producer(topic) for _ in range(count)]
    names = [p.producer_name() for p in producers]
    for p in producers:
        p.close()
    return names


def test_generated_names_are_cluster_instance_counter_and_never_repeat_across_a_restart():
    with conftest.private_server("[broker]\n") as srv:
        client = srv.client()
        first = _names(client, 3)
        client.close()
        assert all(NAME.match(n) for n in first), first
        assert len(set(first)) == 3, first
        srv.restart()
        client = srv.client()
        second = _names(client, 2)
        client.close()
        assert all(NAME.match(n) for n in second), second
        assert not set(first) & set(second), (first, second)
        # The restarted broker is a new instance.
        assert NAME.match(second[0]).group(1) != NAME.match(first[0]).group(1)
