"""Fields the official Java client reads unconditionally (its generated accessors throw on an
unset optional field), checked on the wire because the Python client does not read them.

Found with Apache's pulsar-perf (Java) against Magnetar: PRODUCER_SUCCESS without
schema_version made every producer creation fail with "Field 'schema_version' is not set".
"""

from compat_util import unique_topic
from pulsar_wire import (LOOKUP_RESPONSE, PRODUCER_SUCCESS, RawConnection, cmd_lookup,
                         cmd_producer, simple_frame)

PRODUCER_SUCCESS_SCHEMA_VERSION = 4  # CommandProducerSuccess.schema_version
PRODUCER_SUCCESS_LAST_SEQUENCE_ID = 3


def test_producer_success_always_carries_schema_version_and_last_sequence_id(server):
    topic = unique_topic("java-fields")
    with RawConnection(server.service_url) as conn:
        conn.handshake()
        conn.send(simple_frame(cmd_lookup(topic, 1)))
        conn.expect(LOOKUP_RESPONSE)
        conn.send(simple_frame(cmd_producer(topic, 1, 2)))
        fields = conn.expect(PRODUCER_SUCCESS)
    assert PRODUCER_SUCCESS_SCHEMA_VERSION in fields, fields
    assert PRODUCER_SUCCESS_LAST_SEQUENCE_ID in fields, fields
