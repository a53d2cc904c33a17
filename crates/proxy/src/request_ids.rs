//! The request id of a command a lookup connection forwards, and of its answer: the proxy
//! numbers what it sends each broker itself (a client's ids are its own, and one client's
//! lookups may go to several brokers), and gives each answer back the client's id.

use magnetar_protocol::proto::BaseCommand;

/// Sets the request id of a forwarded request (LOOKUP, PARTITIONED_METADATA,
/// GET_TOPICS_OF_NAMESPACE, GET_SCHEMA); returns the id it had, or None for any other command.
pub fn replace_in_request(command: &mut BaseCommand, id: u64) -> Option<u64> {
    let slot = if let Some(c) = command.lookup_topic.as_mut() {
        &mut c.request_id
    } else if let Some(c) = command.partition_metadata.as_mut() {
        &mut c.request_id
    } else if let Some(c) = command.get_topics_of_namespace.as_mut() {
        &mut c.request_id
    } else if let Some(c) = command.get_schema.as_mut() {
        &mut c.request_id
    } else {
        return None;
    };
    Some(std::mem::replace(slot, id))
}

/// The request id an answer names (the answers of the forwarded requests, and ERROR).
pub fn of_response(command: &BaseCommand) -> Option<u64> {
    if let Some(c) = &command.lookup_topic_response {
        Some(c.request_id)
    } else if let Some(c) = &command.partition_metadata_response {
        Some(c.request_id)
    } else if let Some(c) = &command.get_topics_of_namespace_response {
        Some(c.request_id)
    } else if let Some(c) = &command.get_schema_response {
        Some(c.request_id)
    } else {
        command.error.as_ref().map(|c| c.request_id)
    }
}

/// Gives an answer the client's request id.
pub fn set_in_response(command: &mut BaseCommand, id: u64) {
    if let Some(c) = command.lookup_topic_response.as_mut() {
        c.request_id = id;
    } else if let Some(c) = command.partition_metadata_response.as_mut() {
        c.request_id = id;
    } else if let Some(c) = command.get_topics_of_namespace_response.as_mut() {
        c.request_id = id;
    } else if let Some(c) = command.get_schema_response.as_mut() {
        c.request_id = id;
    } else if let Some(c) = command.error.as_mut() {
        c.request_id = id;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use magnetar_protocol::commands;
    use magnetar_protocol::proto::{base_command::Type, CommandPartitionedTopicMetadata};

    #[test]
    fn a_forwarded_request_and_its_answer_swap_ids_both_ways() {
        let mut request = BaseCommand {
            partition_metadata: Some(Box::new(CommandPartitionedTopicMetadata {
                topic: "persistent://public/default/t".into(),
                request_id: 7,
                ..Default::default()
            })),
            ..commands::base(Type::PartitionedMetadata)
        };
        assert_eq!(replace_in_request(&mut request, 1000), Some(7));
        assert_eq!(request.partition_metadata.as_ref().unwrap().request_id, 1000);
        assert_eq!(replace_in_request(&mut commands::ping(), 1), None, "not a forwarded one");

        let mut answer = commands::partitioned_metadata_response(1000, 3);
        assert_eq!(of_response(&answer), Some(1000));
        set_in_response(&mut answer, 7);
        assert_eq!(of_response(&answer), Some(7));
        let mut error = commands::error(1000, Default::default(), "no");
        set_in_response(&mut error, 7);
        assert_eq!(of_response(&error), Some(7));
        assert_eq!(of_response(&commands::pong()), None);
    }
}
