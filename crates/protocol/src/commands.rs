//! Convenience constructors for the `BaseCommand`s a broker sends (and the
//! few client commands our tests and future client need), plus
//! [`command_type`].
//!
//! Each function sets `BaseCommand.type` and the matching sub-message;
//! adjust optional fields on the result when needed.

use bytes::Bytes;

use crate::proto::base_command::Type;
use crate::proto::command_lookup_topic_response::LookupType;
use crate::proto::command_partitioned_topic_metadata_response::LookupType as PartitionedLookupType;
use crate::proto::{
    AuthData, BaseCommand, CommandAckResponse, CommandActiveConsumerChange, CommandAuthChallenge,
    CommandAuthResponse, CommandCloseConsumer, CommandCloseProducer, CommandConnect,
    CommandConnected, CommandError, CommandFlow, CommandGetLastMessageIdResponse,
    CommandGetOrCreateSchemaResponse, CommandGetSchemaResponse, CommandLookupTopicResponse,
    CommandMessage, CommandPartitionedTopicMetadataResponse, CommandPing, CommandPong,
    CommandProducerSuccess, CommandReachedEndOfTopic, CommandSend, CommandSendError,
    CommandSendReceipt, CommandSuccess, FeatureFlags, MessageIdData, Schema, ServerError,
};

/// The command type, or `None` for a type number unknown to this crate.
///
/// Use this rather than prost's `BaseCommand::r#type()`, which maps unknown
/// numbers to `Type::Connect` (the first enum value).
///
/// prost does not enforce proto2 `required`: a command whose `type` field is
/// missing decodes with the default, CONNECT. Handlers should therefore treat
/// an absent sub-message (`command.connect == None`, ...) as a protocol error.
pub fn command_type(command: &BaseCommand) -> Option<Type> {
    Type::try_from(command.r#type).ok()
}

/// A `BaseCommand` with only its type set.
pub fn base(kind: Type) -> BaseCommand {
    BaseCommand { r#type: kind as i32, ..Default::default() }
}

/// A message id without partition or batch index.
pub fn message_id(ledger_id: u64, entry_id: u64, partition: Option<i32>) -> MessageIdData {
    MessageIdData { ledger_id, entry_id, partition, ..Default::default() }
}

// ---------------------------------------------------------------------------
// Handshake and keep-alive
// ---------------------------------------------------------------------------

/// CONNECT as a client sends it, without authentication.
pub fn connect(client_version: impl Into<String>, protocol_version: i32) -> BaseCommand {
    BaseCommand {
        connect: Some(Box::new(CommandConnect {
            client_version: client_version.into(),
            protocol_version: Some(protocol_version),
            ..Default::default()
        })),
        ..base(Type::Connect)
    }
}

/// CONNECTED. `server_version` is mandatory for the C++ client;
/// `protocol_version` should come from
/// [`crate::constants::negotiate_protocol_version`].
pub fn connected(
    server_version: impl Into<String>,
    protocol_version: i32,
    max_message_size: Option<i32>,
    feature_flags: Option<FeatureFlags>,
) -> BaseCommand {
    BaseCommand {
        connected: Some(Box::new(CommandConnected {
            server_version: server_version.into(),
            protocol_version: Some(protocol_version),
            max_message_size,
            feature_flags,
        })),
        ..base(Type::Connected)
    }
}

/// AUTH_CHALLENGE asking the client to refresh its credentials.
pub fn auth_challenge(
    server_version: impl Into<String>,
    auth_method_name: impl Into<String>,
    challenge: Bytes,
    protocol_version: i32,
) -> BaseCommand {
    BaseCommand {
        auth_challenge: Some(Box::new(CommandAuthChallenge {
            server_version: Some(server_version.into()),
            challenge: Some(AuthData {
                auth_method_name: Some(auth_method_name.into()),
                auth_data: Some(challenge),
            }),
            protocol_version: Some(protocol_version),
        })),
        ..base(Type::AuthChallenge)
    }
}

/// AUTH_RESPONSE: a client's answer to AUTH_CHALLENGE (fresh credentials of `auth_method_name`).
pub fn auth_response(
    client_version: impl Into<String>,
    auth_method_name: impl Into<String>,
    auth_data: Bytes,
    protocol_version: i32,
) -> BaseCommand {
    BaseCommand {
        auth_response: Some(Box::new(CommandAuthResponse {
            client_version: Some(client_version.into()),
            response: Some(AuthData {
                auth_method_name: Some(auth_method_name.into()),
                auth_data: Some(auth_data),
            }),
            protocol_version: Some(protocol_version),
        })),
        ..base(Type::AuthResponse)
    }
}

/// PING.
pub fn ping() -> BaseCommand {
    BaseCommand { ping: Some(Box::new(CommandPing {})), ..base(Type::Ping) }
}

/// PONG.
pub fn pong() -> BaseCommand {
    BaseCommand { pong: Some(Box::new(CommandPong {})), ..base(Type::Pong) }
}

// ---------------------------------------------------------------------------
// Generic replies
// ---------------------------------------------------------------------------

/// SUCCESS for `request_id`.
pub fn success(request_id: u64) -> BaseCommand {
    BaseCommand {
        success: Some(Box::new(CommandSuccess { request_id, schema: None })),
        ..base(Type::Success)
    }
}

/// ERROR for `request_id`.
pub fn error(request_id: u64, error: ServerError, message: impl Into<String>) -> BaseCommand {
    BaseCommand {
        error: Some(Box::new(CommandError {
            request_id,
            error: error as i32,
            message: message.into(),
        })),
        ..base(Type::Error)
    }
}

// ---------------------------------------------------------------------------
// Discovery
// ---------------------------------------------------------------------------

/// PARTITIONED_METADATA_RESPONSE: `partitions` = 0 for a non-partitioned topic.
pub fn partitioned_metadata_response(request_id: u64, partitions: u32) -> BaseCommand {
    BaseCommand {
        partition_metadata_response: Some(Box::new(CommandPartitionedTopicMetadataResponse {
            partitions: Some(partitions),
            request_id,
            response: Some(PartitionedLookupType::Success as i32),
            ..Default::default()
        })),
        ..base(Type::PartitionedMetadataResponse)
    }
}

/// Failed PARTITIONED_METADATA_RESPONSE.
pub fn partitioned_metadata_failed(
    request_id: u64,
    error: ServerError,
    message: impl Into<String>,
) -> BaseCommand {
    BaseCommand {
        partition_metadata_response: Some(Box::new(CommandPartitionedTopicMetadataResponse {
            request_id,
            response: Some(PartitionedLookupType::Failed as i32),
            error: Some(error as i32),
            message: Some(message.into()),
            ..Default::default()
        })),
        ..base(Type::PartitionedMetadataResponse)
    }
}

/// LOOKUP_RESPONSE telling the client where the topic is served.
///
/// `response` is `Connect` (connect to this URL) or `Redirect` (look up
/// again at this URL, with `authoritative` saying whether that broker
/// decides).
pub fn lookup_response(
    request_id: u64,
    response: LookupType,
    broker_service_url: impl Into<String>,
    broker_service_url_tls: Option<String>,
    authoritative: bool,
    proxy_through_service_url: bool,
) -> BaseCommand {
    BaseCommand {
        lookup_topic_response: Some(Box::new(CommandLookupTopicResponse {
            broker_service_url: Some(broker_service_url.into()),
            broker_service_url_tls,
            response: Some(response as i32),
            request_id,
            authoritative: Some(authoritative),
            proxy_through_service_url: Some(proxy_through_service_url),
            ..Default::default()
        })),
        ..base(Type::LookupResponse)
    }
}

/// Failed LOOKUP_RESPONSE.
pub fn lookup_failed(
    request_id: u64,
    error: ServerError,
    message: impl Into<String>,
) -> BaseCommand {
    BaseCommand {
        lookup_topic_response: Some(Box::new(CommandLookupTopicResponse {
            response: Some(LookupType::Failed as i32),
            request_id,
            error: Some(error as i32),
            message: Some(message.into()),
            ..Default::default()
        })),
        ..base(Type::LookupResponse)
    }
}

// ---------------------------------------------------------------------------
// Producing
// ---------------------------------------------------------------------------

/// PRODUCER_SUCCESS (ready producer). `last_sequence_id` is -1 without
/// deduplication. `schema_version` is always sent, empty without a schema, as
/// Pulsar does: the Java client reads it unconditionally.
pub fn producer_success(
    request_id: u64,
    producer_name: impl Into<String>,
    last_sequence_id: i64,
    schema_version: Option<Bytes>,
) -> BaseCommand {
    BaseCommand {
        producer_success: Some(Box::new(CommandProducerSuccess {
            request_id,
            producer_name: producer_name.into(),
            last_sequence_id: Some(last_sequence_id),
            schema_version: Some(schema_version.unwrap_or_default()),
            topic_epoch: None,
            producer_ready: Some(true),
        })),
        ..base(Type::ProducerSuccess)
    }
}

// ---------------------------------------------------------------------------
// Schemas
// ---------------------------------------------------------------------------

/// A schema version as Pulsar puts it on the wire: the version number as an 8-byte
/// big-endian long.
pub fn schema_version_bytes(version: u64) -> Bytes {
    Bytes::copy_from_slice(&version.to_be_bytes())
}

/// The version number in schema-version bytes (`None` unless exactly 8 bytes).
pub fn parse_schema_version(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(bytes.try_into().ok()?))
}

/// GET_SCHEMA_RESPONSE with the schema and its version.
pub fn get_schema_response(request_id: u64, schema: Schema, version: u64) -> BaseCommand {
    BaseCommand {
        get_schema_response: Some(Box::new(CommandGetSchemaResponse {
            request_id,
            schema: Some(schema),
            schema_version: Some(schema_version_bytes(version)),
            ..Default::default()
        })),
        ..base(Type::GetSchemaResponse)
    }
}

/// GET_SCHEMA_RESPONSE carrying an error.
pub fn get_schema_error(
    request_id: u64,
    error: ServerError,
    message: impl Into<String>,
) -> BaseCommand {
    BaseCommand {
        get_schema_response: Some(Box::new(CommandGetSchemaResponse {
            request_id,
            error_code: Some(error as i32),
            error_message: Some(message.into()),
            ..Default::default()
        })),
        ..base(Type::GetSchemaResponse)
    }
}

/// GET_OR_CREATE_SCHEMA_RESPONSE: the schema's version, or an error.
pub fn get_or_create_schema_response(
    request_id: u64,
    result: Result<u64, (ServerError, String)>,
) -> BaseCommand {
    let response = match result {
        Ok(version) => CommandGetOrCreateSchemaResponse {
            request_id,
            schema_version: Some(schema_version_bytes(version)),
            ..Default::default()
        },
        Err((error, message)) => CommandGetOrCreateSchemaResponse {
            request_id,
            error_code: Some(error as i32),
            error_message: Some(message),
            ..Default::default()
        },
    };
    BaseCommand {
        get_or_create_schema_response: Some(Box::new(response)),
        ..base(Type::GetOrCreateSchemaResponse)
    }
}

/// SEND command header, as a client sends it (payload frame).
pub fn send(producer_id: u64, sequence_id: u64, num_messages: i32) -> BaseCommand {
    BaseCommand {
        send: Some(Box::new(CommandSend {
            producer_id,
            sequence_id,
            num_messages: Some(num_messages),
            ..Default::default()
        })),
        ..base(Type::Send)
    }
}

/// SEND_RECEIPT. Receipts must be sent in SEND order for each producer.
pub fn send_receipt(
    producer_id: u64,
    sequence_id: u64,
    message_id: MessageIdData,
    highest_sequence_id: u64,
) -> BaseCommand {
    BaseCommand {
        send_receipt: Some(Box::new(CommandSendReceipt {
            producer_id,
            sequence_id,
            message_id: Some(message_id),
            highest_sequence_id: Some(highest_sequence_id),
        })),
        ..base(Type::SendReceipt)
    }
}

/// SEND_ERROR.
pub fn send_error(
    producer_id: u64,
    sequence_id: u64,
    error: ServerError,
    message: impl Into<String>,
) -> BaseCommand {
    BaseCommand {
        send_error: Some(Box::new(CommandSendError {
            producer_id,
            sequence_id,
            error: error as i32,
            message: message.into(),
        })),
        ..base(Type::SendError)
    }
}

/// CLOSE_PRODUCER sent by the broker (e.g. on topic unload).
pub fn close_producer(producer_id: u64, request_id: u64) -> BaseCommand {
    close_producer_to(producer_id, request_id, None)
}

/// Where a closed producer or consumer should reconnect (PIP-307): the broker its topic is
/// handed over to, so the client goes there at once, without a lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssignedBroker {
    pub service_url: String,
    pub service_url_tls: Option<String>,
}

/// CLOSE_PRODUCER sent by the broker, naming the broker to reconnect to when there is one.
pub fn close_producer_to(
    producer_id: u64,
    request_id: u64,
    assigned: Option<&AssignedBroker>,
) -> BaseCommand {
    BaseCommand {
        close_producer: Some(Box::new(CommandCloseProducer {
            producer_id,
            request_id,
            assigned_broker_service_url: assigned.map(|a| a.service_url.clone()),
            assigned_broker_service_url_tls: assigned.and_then(|a| a.service_url_tls.clone()),
        })),
        ..base(Type::CloseProducer)
    }
}

// ---------------------------------------------------------------------------
// Consuming
// ---------------------------------------------------------------------------

/// FLOW, as a client sends it.
pub fn flow(consumer_id: u64, message_permits: u32) -> BaseCommand {
    BaseCommand {
        flow: Some(Box::new(CommandFlow { consumer_id, message_permits })),
        ..base(Type::Flow)
    }
}

/// MESSAGE command header (payload frame). `ack_set` is empty unless part
/// of a batch was already acknowledged.
pub fn message(
    consumer_id: u64,
    message_id: MessageIdData,
    redelivery_count: u32,
    ack_set: Vec<i64>,
    consumer_epoch: Option<u64>,
) -> BaseCommand {
    BaseCommand {
        message: Some(Box::new(CommandMessage {
            consumer_id,
            message_id,
            redelivery_count: Some(redelivery_count),
            ack_set,
            consumer_epoch,
        })),
        ..base(Type::Message)
    }
}

/// ACK_RESPONSE for an ack that carried `request_id`; `error` is `None` on success.
pub fn ack_response(
    consumer_id: u64,
    request_id: u64,
    error: Option<(ServerError, String)>,
) -> BaseCommand {
    let (error, message) = match error {
        Some((e, m)) => (Some(e as i32), Some(m)),
        None => (None, None),
    };
    BaseCommand {
        ack_response: Some(Box::new(CommandAckResponse {
            consumer_id,
            request_id: Some(request_id),
            error,
            message,
            ..Default::default()
        })),
        ..base(Type::AckResponse)
    }
}

/// CLOSE_CONSUMER sent by the broker (e.g. on topic unload or seek).
pub fn close_consumer(consumer_id: u64, request_id: u64) -> BaseCommand {
    close_consumer_to(consumer_id, request_id, None)
}

/// CLOSE_CONSUMER sent by the broker, naming the broker to reconnect to when there is one.
pub fn close_consumer_to(
    consumer_id: u64,
    request_id: u64,
    assigned: Option<&AssignedBroker>,
) -> BaseCommand {
    BaseCommand {
        close_consumer: Some(Box::new(CommandCloseConsumer {
            consumer_id,
            request_id,
            assigned_broker_service_url: assigned.map(|a| a.service_url.clone()),
            assigned_broker_service_url_tls: assigned.and_then(|a| a.service_url_tls.clone()),
        })),
        ..base(Type::CloseConsumer)
    }
}

/// ACTIVE_CONSUMER_CHANGE (Failover subscriptions).
pub fn active_consumer_change(consumer_id: u64, is_active: bool) -> BaseCommand {
    BaseCommand {
        active_consumer_change: Some(Box::new(CommandActiveConsumerChange {
            consumer_id,
            is_active: Some(is_active),
        })),
        ..base(Type::ActiveConsumerChange)
    }
}

/// REACHED_END_OF_TOPIC.
pub fn reached_end_of_topic(consumer_id: u64) -> BaseCommand {
    BaseCommand {
        reached_end_of_topic: Some(Box::new(CommandReachedEndOfTopic { consumer_id })),
        ..base(Type::ReachedEndOfTopic)
    }
}

/// GET_TOPICS_OF_NAMESPACE_RESPONSE. `topics` is `None` when the list is left out because the
/// client's hash still matches (then `changed` is false).
pub fn get_topics_of_namespace_response(
    request_id: u64,
    topics: Option<Vec<String>>,
    filtered: bool,
    topics_hash: impl Into<String>,
) -> BaseCommand {
    let changed = topics.is_some();
    BaseCommand {
        get_topics_of_namespace_response: Some(Box::new(
            crate::proto::CommandGetTopicsOfNamespaceResponse {
                request_id,
                topics: topics.unwrap_or_default(),
                filtered: Some(filtered),
                topics_hash: Some(topics_hash.into()),
                changed: Some(changed),
            },
        )),
        ..base(Type::GetTopicsOfNamespaceResponse)
    }
}

/// GET_LAST_MESSAGE_ID_RESPONSE.
pub fn get_last_message_id_response(
    request_id: u64,
    last_message_id: MessageIdData,
    consumer_mark_delete_position: Option<MessageIdData>,
) -> BaseCommand {
    BaseCommand {
        get_last_message_id_response: Some(Box::new(CommandGetLastMessageIdResponse {
            last_message_id,
            request_id,
            consumer_mark_delete_position,
        })),
        ..base(Type::GetLastMessageIdResponse)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{
        encode_command, encode_payload_command, metadata_and_payload, FrameDecoder,
    };
    use crate::proto::MessageMetadata;
    use bytes::BytesMut;

    fn round_trip(cmd: &BaseCommand) -> BaseCommand {
        let mut buf = BytesMut::new();
        let is_payload = matches!(command_type(cmd), Some(Type::Send | Type::Message));
        if is_payload {
            let entry = metadata_and_payload(&MessageMetadata::default(), b"x").expect("entry");
            encode_payload_command(cmd, None, &entry, &mut buf).expect("encode");
        } else {
            encode_command(cmd, &mut buf).expect("encode");
        }
        let (frame, used) =
            FrameDecoder::default().decode(&buf).expect("decode").expect("complete");
        assert_eq!(used, buf.len());
        assert_eq!(frame.payload.is_some(), is_payload);
        frame.command
    }

    #[test]
    fn schema_versions_are_big_endian_longs() {
        assert_eq!(&schema_version_bytes(1)[..], &[0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(parse_schema_version(&schema_version_bytes(258)), Some(258));
        assert_eq!(parse_schema_version(&[0, 1]), None);
        let reply = round_trip(&get_or_create_schema_response(7, Ok(3)));
        let body = reply.get_or_create_schema_response.expect("body");
        assert_eq!(body.schema_version.as_deref(), Some(&[0, 0, 0, 0, 0, 0, 0, 3][..]));
        let schema = Schema { name: "t/ns/x".into(), r#type: 4, ..Default::default() };
        let reply = round_trip(&get_schema_response(8, schema.clone(), 2));
        let body = reply.get_schema_response.expect("body");
        assert_eq!((body.request_id, body.schema), (8, Some(schema)));
        let reply = round_trip(&get_schema_error(9, ServerError::TopicNotFound, "none"));
        let body = reply.get_schema_response.expect("body");
        assert_eq!(body.error_code, Some(ServerError::TopicNotFound as i32));
    }

    #[test]
    fn every_constructor_sets_type_and_body_and_round_trips() {
        let id = message_id(3, 4, Some(1));
        let cases: Vec<(BaseCommand, Type)> = vec![
            (connect("test-client", 21), Type::Connect),
            (connected("magnetar", 21, Some(5_242_880), None), Type::Connected),
            (
                auth_challenge("magnetar", "token", Bytes::from_static(b"x"), 21),
                Type::AuthChallenge,
            ),
            (ping(), Type::Ping),
            (pong(), Type::Pong),
            (success(7), Type::Success),
            (error(7, ServerError::TopicNotFound, "nope"), Type::Error),
            (partitioned_metadata_response(1, 0), Type::PartitionedMetadataResponse),
            (
                partitioned_metadata_failed(1, ServerError::TopicNotFound, "x"),
                Type::PartitionedMetadataResponse,
            ),
            (
                lookup_response(2, LookupType::Connect, "pulsar://h:6650", None, true, false),
                Type::LookupResponse,
            ),
            (lookup_failed(2, ServerError::ServiceNotReady, "x"), Type::LookupResponse),
            (producer_success(3, "p", -1, None), Type::ProducerSuccess),
            (send(1, 2, 1), Type::Send),
            (send_receipt(1, 2, id.clone(), 2), Type::SendReceipt),
            (send_error(1, 2, ServerError::ChecksumError, "bad"), Type::SendError),
            (close_producer(1, 9), Type::CloseProducer),
            (flow(5, 1000), Type::Flow),
            (message(5, id.clone(), 0, vec![], Some(1)), Type::Message),
            (ack_response(5, 8, None), Type::AckResponse),
            (close_consumer(5, 9), Type::CloseConsumer),
            (active_consumer_change(5, true), Type::ActiveConsumerChange),
            (reached_end_of_topic(5), Type::ReachedEndOfTopic),
            (get_last_message_id_response(4, id, None), Type::GetLastMessageIdResponse),
        ];
        for (cmd, kind) in cases {
            assert_eq!(command_type(&cmd), Some(kind));
            let decoded = round_trip(&cmd);
            assert_eq!(decoded, cmd, "{kind:?}");
            // The sub-message whose field number equals the type is set:
            // re-encoding must contain that field tag.
            assert_ne!(decoded, base(kind), "{kind:?} has no body");
        }
    }

    #[test]
    fn unknown_type_is_not_silently_connect() {
        let cmd = BaseCommand {
            r#type: 70, // SCALABLE_TOPIC_LOOKUP: known number, body not modelled
            ..Default::default()
        };
        assert_eq!(command_type(&cmd), Some(Type::ScalableTopicLookup));
        let cmd = BaseCommand { r#type: 1000, ..Default::default() };
        assert_eq!(command_type(&cmd), None);
        assert_eq!(round_trip(&cmd).r#type, 1000);
    }

    #[test]
    fn defaults_of_optional_fields_follow_pulsar() {
        let id = message_id(1, 2, None);
        assert_eq!(id.partition(), -1);
        assert_eq!(id.batch_index(), -1);
        let ps = producer_success(1, "p", -1, None);
        assert!(ps.producer_success.as_ref().is_some_and(|p| p.producer_ready()));
        assert_eq!(
            ps.producer_success.as_ref().and_then(|p| p.schema_version.clone()),
            Some(Bytes::new())
        );
        let sub = crate::proto::CommandSubscribe::default();
        assert!(sub.durable());
        assert!(sub.force_topic_creation());
    }
}
