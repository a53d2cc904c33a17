"""Schemas: typed producers and consumers (JSON and Avro records), versions in the topic's schema
registry, Pulsar's default compatibility strategy (FULL), the admin schema endpoints, and
durability of schemas across a restart.

Pulsar facts encoded here: a schema is registered per topic (partitions share it) with versions
0, 1, ...; the same schema again keeps its version; under FULL a new field needs a default, a
changed field type or another schema type is refused with IncompatibleSchema; a producer without
a schema may still publish to a topic with one (schema validation is not enforced by default);
a consumer's schema becomes the topic's schema only while the topic is idle (no data, producers
or consumers), otherwise it must be able to read the topic's schema."""

import json
import struct

import _pulsar  # SchemaType of SchemaInfo (as pulsar.schema uses it)
import pulsar
import pytest
from pulsar.schema import AvroSchema, Integer, JsonSchema, Record, String, StringSchema

from compat_util import http_request, receive_n, short_name, unique_topic


# Two versions of the same record (same Avro name "User"): V2 adds a field with a default.
class User(Record):
    name = String()
    age = Integer()


def _user_v2():
    class User(Record):  # noqa: F811 - same record name on purpose
        name = String()
        age = Integer()
        email = String(required_default=True)  # ["null","string"] with default null
    return User


def _user_no_default():
    class User(Record):  # noqa: F811
        name = String()
        age = Integer()
        email = String()  # no default: old data cannot be read with it
    return User


def _user_age_as_string():
    class User(Record):  # noqa: F811
        name = String()
        age = String()
    return User


def schema_url(server, topic, suffix="schema"):
    return "%s/admin/v2/schemas/public/default/%s/%s" % (server.web_url, short_name(topic), suffix)


def get_json(url):
    status, body = http_request("GET", url)
    return status, (json.loads(body) if body else None)


def version_bytes(version):
    return struct.pack(">q", version)


def as_bytes(value):
    return value.encode("latin-1") if isinstance(value, str) else bytes(value)


@pytest.mark.parametrize("schema_cls", [JsonSchema, AvroSchema], ids=["json", "avro"])
def test_typed_records_round_trip(client, server, schema_cls):
    topic = unique_topic("schema-rt")
    consumer = client.subscribe(topic, "s", schema=schema_cls(User))
    producer = client.create_producer(topic, schema=schema_cls(User))
    sent = [User(name="user-%d" % i, age=i) for i in range(5)]
    for user in sent:
        producer.send(user)
    got = receive_n(consumer, 5)
    assert [(m.value().name, m.value().age) for m in got] == [(u.name, u.age) for u in sent]
    # the messages carry the schema version the broker gave the producer: 0, the first one
    assert as_bytes(got[0].schema_version()) == version_bytes(0)

    status, latest = get_json(schema_url(server, topic))
    assert status == 200, latest
    assert latest["version"] == 0
    assert latest["type"] == ("JSON" if schema_cls is JsonSchema else "AVRO")
    definition = json.loads(latest["data"])
    assert definition["name"] == "User"
    assert sorted(f["name"] for f in definition["fields"]) == ["age", "name"]
    assert latest["timestamp"] > 0


def test_same_schema_keeps_its_version(client, server):
    topic = unique_topic("schema-same")
    p1 = client.create_producer(topic, schema=AvroSchema(User))
    p2 = client.create_producer(topic, schema=AvroSchema(User))
    consumer = client.subscribe(topic, "s", schema=AvroSchema(User),
                                initial_position=pulsar.InitialPosition.Earliest)
    p1.send(User(name="a", age=1))
    p2.send(User(name="b", age=2))
    got = receive_n(consumer, 2)
    assert [as_bytes(m.schema_version()) for m in got] == [version_bytes(0)] * 2
    status, all_versions = get_json(schema_url(server, topic, "schemas"))
    assert status == 200, all_versions
    assert [s["version"] for s in all_versions["getSchemaResponses"]] == [0]


def test_a_topic_s_own_compatibility_strategy_wins_over_the_namespace_s(client, server):
    """`PUT .../{topic}/schemaCompatibilityStrategy` (pulsar-admin topicPolicies
    set-schema-compatibility-strategy): ALWAYS_INCOMPATIBLE on the topic refuses the compatible
    new version the namespace's default (FULL) accepts elsewhere; removed, it is accepted."""
    topic = unique_topic("schema-topic-strategy")
    url = "%s/admin/v2/persistent/public/default/%s/schemaCompatibilityStrategy" % (
        server.web_url, short_name(topic))
    status, body = http_request("PUT", url, '"ALWAYS_INCOMPATIBLE"')
    assert status in (200, 204), (status, body)
    status, body = http_request("GET", url)
    assert status == 200 and json.loads(body) == "ALWAYS_INCOMPATIBLE", (status, body)
    client.create_producer(topic, schema=AvroSchema(User)).close()  # the first version
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic, schema=AvroSchema(_user_v2()))
    status, body = http_request("DELETE", url)
    assert status in (200, 204), (status, body)
    client.create_producer(topic, schema=AvroSchema(_user_v2())).close()


def test_a_renamed_record_evolves_under_forward(client, server):
    """The Python client's test_schema_evolve: the client names a record after its class, so
    User1 then User2 (age now required) are two record names; Pulsar's check (Avro's resolver)
    compares fields, not record names. Under FORWARD the old reader reads both producers."""
    class User1(Record):
        name = String()
        age = Integer()

    class User2(Record):
        _sorted_fields = True
        name = String()
        age = Integer(required=True)

    # A namespace of its own with FORWARD, as the Python test sets public/default's (a topic's
    # own strategy would do too, but Pulsar applies topic policies asynchronously).
    namespace = "public/" + short_name(unique_topic("evolve"))
    status, body = http_request("PUT", "%s/admin/v2/namespaces/%s" % (server.web_url, namespace))
    assert status in (200, 204), (status, body)
    url = "%s/admin/v2/namespaces/%s/schemaCompatibilityStrategy" % (server.web_url, namespace)
    status, body = http_request("PUT", url, '"FORWARD"')
    assert status in (200, 204), (status, body)
    topic = "persistent://%s/%s" % (namespace, short_name(unique_topic("schema-evolve")))
    producer1 = client.create_producer(topic, schema=AvroSchema(User1))
    consumer = client.subscribe(topic, "sub", schema=AvroSchema(User1))
    reader = client.create_reader(topic, pulsar.MessageId.earliest, schema=AvroSchema(User1))
    producer2 = client.create_producer(topic, schema=AvroSchema(User2))
    for i in range(10):
        producer1.send(User1(name="u1-%d" % i, age=i))
        producer2.send(User2(name="u2-%d" % i, age=i))
    want = sorted([("u1-%d" % i, i) for i in range(10)] + [("u2-%d" % i, i) for i in range(10)])
    consumed = [m.value() for m in receive_n(consumer, 20)]
    read = [reader.read_next(timeout_millis=10_000).value() for _ in range(20)]
    for got in (consumed, read):
        assert sorted((u.name, u.age) for u in got) == want
    # What still refuses is the fields: under FULL, a new required field without a default.
    status, body = http_request("PUT", url, '"FULL"')
    assert status in (200, 204), (status, body)

    class User3(Record):
        name = String()
        age = Integer(required=True)
        email = String(required=True)
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic, schema=AvroSchema(User3))


def test_the_version_of_a_schema_is_found_by_its_definition(client, server):
    """`POST .../version` (Pulsar's getVersionBySchema, `admin.schemas().getVersionBySchema`):
    the version holding exactly the posted schema, -1 for one the topic never had."""
    topic = unique_topic("schema-version-of")
    UserV2 = _user_v2()
    client.create_producer(topic, schema=AvroSchema(User)).close()
    client.create_producer(topic, schema=AvroSchema(UserV2)).close()
    url = schema_url(server, topic, "version")

    def version_of(record):
        definition = AvroSchema(record).schema_info().schema()
        status, body = http_request("POST", url, json.dumps(
            {"type": "AVRO", "schema": definition, "properties": {}}))
        assert status == 200, (status, body)
        return json.loads(body)["version"]
    assert (version_of(User), version_of(UserV2), version_of(_user_age_as_string())) == (0, 1, -1)


def test_compatible_evolution_gets_a_new_version(client, server):
    topic = unique_topic("schema-evolve")
    UserV2 = _user_v2()
    p1 = client.create_producer(topic, schema=AvroSchema(User))
    p1.send(User(name="old", age=1))
    p2 = client.create_producer(topic, schema=AvroSchema(UserV2))
    consumer = client.subscribe(topic, "s", schema=AvroSchema(UserV2),
                                initial_position=pulsar.InitialPosition.Earliest)
    p2.send(UserV2(name="new", age=2, email="n@example.com"))
    got = receive_n(consumer, 2)
    assert [as_bytes(m.schema_version()) for m in got] == [version_bytes(0), version_bytes(1)]
    assert got[1].value().email == "n@example.com"

    status, all_versions = get_json(schema_url(server, topic, "schemas"))
    assert status == 200, all_versions
    versions = all_versions["getSchemaResponses"]
    assert [s["version"] for s in versions] == [0, 1]
    assert "email" not in versions[0]["data"] and "email" in versions[1]["data"]
    status, v0 = get_json(schema_url(server, topic, "schema/0"))
    assert status == 200 and v0["version"] == 0 and v0["type"] == "AVRO"
    status, latest = get_json(schema_url(server, topic))
    assert status == 200 and latest["version"] == 1
    status, _ = get_json(schema_url(server, topic, "schema/7"))
    assert status == 404

    # GET_SCHEMA on the binary protocol (what the Avro decoder uses to fetch writer schemas)
    native = client._client  # the C++ client under the Python wrapper
    for version, has_email in ((0, False), (1, True), (-1, True)):  # -1: latest
        info = native.get_schema_info(topic, version)
        assert info.schema_type() == _pulsar.SchemaType.AVRO
        assert ("email" in info.schema()) == has_email, (version, info.schema())
    with pytest.raises(pulsar.PulsarException):
        native.get_schema_info(topic, 7)


def test_incompatible_schemas_are_refused(client, server):
    topic = unique_topic("schema-incompat")
    producer = client.create_producer(topic, schema=JsonSchema(User))
    producer.send(User(name="x", age=1))
    for schema in (JsonSchema(_user_no_default()), JsonSchema(_user_age_as_string()),
                   AvroSchema(User), StringSchema()):
        with pytest.raises(pulsar.IncompatibleSchema):
            client.create_producer(topic, schema=schema)
    # nothing was registered by the refused producers
    status, all_versions = get_json(schema_url(server, topic, "schemas"))
    assert status == 200
    assert [s["version"] for s in all_versions["getSchemaResponses"]] == [0]
    # the topic keeps working for its schema
    producer.send(User(name="y", age=2))


def test_producer_without_schema_may_publish(client):
    topic = unique_topic("schema-bytes")
    typed = client.create_producer(topic, schema=JsonSchema(User))
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    typed.send(User(name="t", age=1))
    raw = client.create_producer(topic)  # BYTES: no schema sent
    raw.send(b"raw bytes")
    got = receive_n(consumer, 2)
    assert json.loads(got[0].data()) == {"name": "t", "age": 1}
    assert got[1].data() == b"raw bytes"


def test_consumer_schema_rules(client, server):
    # an idle topic takes the consumer's schema
    idle = unique_topic("schema-consumer-idle")
    client.subscribe(idle, "s", schema=AvroSchema(User)).close()
    status, latest = get_json(schema_url(server, idle))
    assert status == 200 and latest["type"] == "AVRO", latest

    # a topic with data but no schema refuses a consumer with a schema
    busy = unique_topic("schema-consumer-busy")
    client.create_producer(busy).send(b"untyped")
    with pytest.raises(pulsar.IncompatibleSchema):
        client.subscribe(busy, "s", schema=AvroSchema(User))

    # a consumer whose schema cannot read the topic's schema is refused
    with pytest.raises(pulsar.IncompatibleSchema):
        client.subscribe(idle, "s2", schema=AvroSchema(_user_no_default()))
    # one that can (field with default) is accepted, without registering a version
    client.subscribe(idle, "s3", schema=AvroSchema(_user_v2())).close()
    status, all_versions = get_json(schema_url(server, idle, "schemas"))
    assert [s["version"] for s in all_versions["getSchemaResponses"]] == [0]


def test_non_persistent_topics_have_schemas_too(client, server):
    """Pulsar registers and checks schemas on non-persistent topics as on persistent ones (the
    registry is keyed without the domain): versions, refusals and the idle-topic rule."""
    name = "schema-np-%s" % unique_topic().rsplit("-", 1)[1]
    topic = "non-persistent://public/default/" + name
    # an idle topic takes the consumer's schema
    consumer = client.subscribe(topic, "s", schema=AvroSchema(User))
    status, latest = get_json(schema_url(server, topic))
    assert status == 200 and latest["type"] == "AVRO" and latest["version"] == 0, latest
    producer = client.create_producer(topic, schema=AvroSchema(User))
    producer.send(User(name="np", age=7))
    got = receive_n(consumer, 1)[0]
    assert (got.value().name, got.value().age) == ("np", 7)
    assert as_bytes(got.schema_version()) == version_bytes(0)
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic, schema=AvroSchema(_user_age_as_string()))
    user_v2 = _user_v2()
    evolved = client.create_producer(topic, schema=AvroSchema(user_v2))
    evolved.send(user_v2(name="v2", age=8, email="e"))
    assert as_bytes(receive_n(consumer, 1)[0].schema_version()) == version_bytes(1)
    # a busy topic without a schema refuses a consumer with one
    busy = "non-persistent://public/default/schema-np-busy-%s" % name.rsplit("-", 1)[1]
    untyped = client.create_producer(busy)
    with pytest.raises(pulsar.IncompatibleSchema):
        client.subscribe(busy, "s", schema=AvroSchema(User))
    untyped.close()


def test_partitions_share_one_schema(client, server):
    topic = unique_topic("schema-part")
    status, body = http_request("PUT", "%s/admin/v2/persistent/public/default/%s/partitions"
                                % (server.web_url, short_name(topic)), body="3")
    assert 200 <= status < 300, (status, body)
    producer = client.create_producer(topic, schema=JsonSchema(User))
    for i in range(6):
        producer.send(User(name="p", age=i))
    status, all_versions = get_json(schema_url(server, topic, "schemas"))
    assert status == 200
    assert [s["version"] for s in all_versions["getSchemaResponses"]] == [0]
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic + "-partition-1", schema=JsonSchema(_user_age_as_string()))


def test_admin_upload_check_and_delete(server):
    topic = unique_topic("schema-admin")
    v1 = json.dumps(User.schema())
    payload = json.dumps({"type": "AVRO", "schema": v1, "properties": {"owner": "tests"}})
    status, body = http_request("POST", schema_url(server, topic), body=payload)
    assert 200 <= status < 300, (status, body)
    status, latest = get_json(schema_url(server, topic))
    assert status == 200
    assert latest["version"] == 0 and latest["properties"] == {"owner": "tests"}
    assert json.loads(latest["data"]) == User.schema()

    def check(record_cls, schema_type="AVRO"):
        # Pulsar's IsCompatibilityResponse: {"compatibility": true, ...}; an incompatible
        # schema is an error carrying the reason (Pulsar 4.0.7: 500 from the check's
        # exception; Magnetar: 409, as an incompatible upload gets).
        body = json.dumps({"type": schema_type, "schema": json.dumps(record_cls.schema())})
        status, reply = http_request("POST", schema_url(server, topic, "compatibility"), body=body)
        reply = json.loads(reply)
        if status in (409, 500):
            assert reply["reason"], reply
            return False
        assert 200 <= status < 300, (status, reply)
        assert reply["schemaCompatibilityStrategy"] == "FULL"
        return reply["compatibility"]

    assert check(_user_v2()) is True
    assert check(_user_no_default()) is False
    assert check(User, "JSON") is False

    # an incompatible upload is refused (409) and adds no version
    bad = json.dumps({"type": "AVRO", "schema": json.dumps(_user_age_as_string().schema())})
    status, _ = http_request("POST", schema_url(server, topic), body=bad)
    assert status == 409

    status, body = http_request("DELETE", schema_url(server, topic))
    assert status == 200, body
    assert json.loads(body)["version"] == 1  # the delete is a version of its own
    status, _ = get_json(schema_url(server, topic))
    assert status == 404
    status, all_versions = get_json(schema_url(server, topic, "schemas"))
    assert status == 200 and all_versions["getSchemaResponses"] == []
    # after a delete any schema may start the history again
    status, body = http_request("POST", schema_url(server, topic), body=bad)
    assert 200 <= status < 300, (status, body)
    status, latest = get_json(schema_url(server, topic))
    assert status == 200 and latest["version"] == 2


def test_deleting_the_topic_deletes_its_schema(client, server):
    topic = unique_topic("schema-deltopic")
    producer = client.create_producer(topic, schema=JsonSchema(User))
    producer.send(User(name="x", age=1))
    producer.close()
    status, _ = get_json(schema_url(server, topic))
    assert status == 200
    status, body = http_request("DELETE", "%s/admin/v2/persistent/public/default/%s"
                                % (server.web_url, short_name(topic)))
    assert 200 <= status < 300, (status, body)
    status, _ = get_json(schema_url(server, topic))
    assert status == 404
    # a topic of the same name starts without a schema: any type is accepted
    client.create_producer(topic, schema=AvroSchema(_user_age_as_string())).close()
    status, latest = get_json(schema_url(server, topic))
    assert status == 200 and latest["type"] == "AVRO" and latest["version"] == 0


@pytest.mark.restarts_server
def test_schema_survives_restart(server):
    topic = unique_topic("schema-restart")
    c1 = server.client()
    c1.create_producer(topic, schema=AvroSchema(User)).send(User(name="a", age=1))
    c1.create_producer(topic, schema=AvroSchema(_user_v2()))
    c1.close()

    assert server.stop(timeout=60), "the broker did not exit within 60 s of SIGTERM"
    server.start()

    status, all_versions = get_json(schema_url(server, topic, "schemas"))
    assert status == 200
    assert [s["version"] for s in all_versions["getSchemaResponses"]] == [0, 1]
    c2 = server.client()
    try:
        # the restarted broker still enforces the stored schema and reuses its versions
        with pytest.raises(pulsar.IncompatibleSchema):
            c2.create_producer(topic, schema=AvroSchema(_user_age_as_string()))
        consumer = c2.subscribe(topic, "s", schema=AvroSchema(User),
                                initial_position=pulsar.InitialPosition.Earliest)
        producer = c2.create_producer(topic, schema=AvroSchema(User))
        producer.send(User(name="b", age=2))
        got = receive_n(consumer, 2)
        assert [m.value().name for m in got] == ["a", "b"]
        assert [as_bytes(m.schema_version()) for m in got] == [version_bytes(0)] * 2
    finally:
        c2.close()
