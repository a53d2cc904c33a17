"""Deleting a topic's schema (DELETE /admin/v2/schemas/{tenant}/{ns}/{topic}/schema) hides every
version it had: Pulsar's SchemaRegistryServiceImpl.getSchema(id, version) only returns versions
that remain after trimming the deleted history ("If the schema has been deleted, it cannot be
obtained"), so

- the admin API answers 404 for GET .../schema/{old version};
- the binary protocol answers GET_SCHEMA for an old version with GET_SCHEMA_RESPONSE carrying
  error_code TopicNotFound ("Topic not found or no-schema ...") and no schema.

(The Go client does not expose GET_SCHEMA by version, so this is raw frames and the admin API.)"""

import json
import struct

from pulsar.schema import Integer, JsonSchema, Record, String

from compat_util import http_request, short_name, unique_topic
import pulsar_wire as wire
import raw_frames as raw


class Reading(Record):
    sensor = String()
    value = Integer()


def _schema_url(server, topic, suffix):
    return "%s/admin/v2/schemas/public/default/%s/%s" % (server.web_url, short_name(topic), suffix)


def _get_schema(conn, topic, request_id, version):
    # CommandGetSchema: request_id 1, topic 2, schema_version 3 (8 bytes, big-endian long)
    body = wire.f_varint(1, request_id) + wire.f_bytes(2, topic)
    if version is not None:
        body += wire.f_bytes(3, struct.pack(">q", version))
    conn.send(raw.frame(raw.GET_SCHEMA, body))
    fields = conn.expect(raw.GET_SCHEMA_RESPONSE, timeout=10)
    # CommandGetSchemaResponse: request_id 1, error_code 2, error_message 3, schema 4,
    # schema_version 5
    assert fields[1] == [request_id], fields
    return fields


def test_deleted_schema_versions_cannot_be_fetched(client, server):
    topic = unique_topic("schema-delver")
    producer = client.create_producer(topic, schema=JsonSchema(Reading))
    producer.send(Reading(sensor="s1", value=1))
    producer.close()

    # Before the delete: version 0 is there, over the admin API and the protocol.
    status, body = http_request("GET", _schema_url(server, topic, "schema/0"))
    assert status == 200, (status, body)
    assert json.loads(body)["version"] == 0
    with wire.RawConnection(server.service_url) as conn:
        conn.handshake()
        before = _get_schema(conn, topic, 1, 0)
        assert 2 not in before and 4 in before, "GET_SCHEMA version 0 before the delete: %r" % before

    status, body = http_request("DELETE", _schema_url(server, topic, "schema"))
    assert status == 200, (status, body)

    # After it: version 0 is gone.
    status, body = http_request("GET", _schema_url(server, topic, "schema/0"))
    assert status == 404, "GET schema/0 after the schema was deleted answered %s %r" % (status, body)
    with wire.RawConnection(server.service_url) as conn:
        conn.handshake()
        after = _get_schema(conn, topic, 2, 0)
        assert 4 not in after, "GET_SCHEMA returned deleted version 0: %r" % after
        assert after.get(2) == [raw.TOPIC_NOT_FOUND], (
            "GET_SCHEMA for a deleted version: error_code %r, want TopicNotFound (%d)"
            % (after.get(2), raw.TOPIC_NOT_FOUND))
        # the connection is still fine
        conn.send(raw.ping_frame())
        conn.expect(wire.PONG, timeout=5)


def test_deleted_versions_stay_hidden_after_a_new_schema(client, server):
    """A schema registered after the delete starts a new history; the versions from before the
    delete stay unavailable."""
    topic = unique_topic("schema-delver2")
    producer = client.create_producer(topic, schema=JsonSchema(Reading))
    producer.send(Reading(sensor="s1", value=1))
    producer.close()
    status, body = http_request("DELETE", _schema_url(server, topic, "schema"))
    assert status == 200, (status, body)
    deleted_as = json.loads(body)["version"]   # the delete is a version of its own (1)

    payload = json.dumps({"type": "JSON", "schema": json.dumps(Reading.schema())})
    status, body = http_request("POST", _schema_url(server, topic, "schema"), body=payload)
    assert 200 <= status < 300, (status, body)
    status, latest = http_request("GET", _schema_url(server, topic, "schema"))
    assert status == 200, (status, latest)
    new_version = json.loads(latest)["version"]
    assert new_version > deleted_as

    for old in (0, deleted_as):
        status, body = http_request("GET", _schema_url(server, topic, "schema/%d" % old))
        assert status == 404, "GET schema/%d (deleted history) answered %s %r" % (old, status, body)
    status, body = http_request("GET", _schema_url(server, topic, "schema/%d" % new_version))
    assert status == 200, (status, body)
    with wire.RawConnection(server.service_url) as conn:
        conn.handshake()
        gone = _get_schema(conn, topic, 1, 0)
        assert 4 not in gone and gone.get(2) == [raw.TOPIC_NOT_FOUND], gone
        there = _get_schema(conn, topic, 2, new_version)
        assert 2 not in there and 4 in there, there
