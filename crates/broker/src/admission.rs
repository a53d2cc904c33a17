//! The rules a consumer passes to join a subscription, shared by persistent and non-persistent
//! topics so that clients see Pulsar's errors, word for word, on both: the consumer limits
//! (`isConsumersExceededOnTopic`, `isConsumersExceededOnSubscription`), one type per
//! subscription, one consumer on an Exclusive one, and one Key_Shared policy per subscription.

use crate::error::BrokerError;
use magnetar_protocol::proto::command_subscribe::SubType;

/// Whether a topic with `max` consumers at most (0: unlimited) takes one more; `count` is
/// asked only when there is a limit (it may sum over subscriptions).
pub fn topic_has_room(max: u32, count: impl FnOnce() -> usize) -> Result<(), BrokerError> {
    if max > 0 && count() >= max as usize {
        return Err(BrokerError::ConsumerBusy("Topic reached max consumers limit".into()));
    }
    Ok(())
}

/// Whether a subscription with `count` consumers takes one more under `max` (0: unlimited).
pub fn subscription_has_room(max: u32, count: usize) -> Result<(), BrokerError> {
    if max > 0 && count >= max as usize {
        return Err(BrokerError::ConsumerBusy("Subscription reached max consumers limit".into()));
    }
    Ok(())
}

/// Whether a `requested` consumer may join subscription `name`, whose connected consumers are
/// of type `current` (`None`: it has none).
pub fn type_admits(
    current: Option<SubType>,
    requested: SubType,
    name: &str,
) -> Result<(), BrokerError> {
    match current {
        None => Ok(()),
        Some(current) if current != requested => {
            Err(BrokerError::ConsumerBusy(format!("subscription {name} is of a different type")))
        }
        Some(SubType::Exclusive) => Err(BrokerError::ConsumerBusy(format!(
            "exclusive consumer is already connected to subscription {name}"
        ))),
        Some(_) => Ok(()),
    }
}

/// A Key_Shared consumer whose mode (or ordering) differs from the subscription's.
pub fn different_key_shared_policy(name: &str) -> BrokerError {
    BrokerError::ConsumerBusy(format!("subscription {name} has a different Key_Shared policy"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_count_only_when_set_and_refuse_at_the_limit() {
        assert!(topic_has_room(0, || unreachable!("no limit, no count")).is_ok());
        assert!(topic_has_room(2, || 1).is_ok());
        let refused = topic_has_room(2, || 2).unwrap_err();
        assert_eq!(refused.to_string(), "Topic reached max consumers limit");
        assert!(subscription_has_room(0, 100).is_ok());
        assert!(subscription_has_room(1, 0).is_ok());
        assert!(matches!(subscription_has_room(1, 1), Err(BrokerError::ConsumerBusy(_))));
    }

    #[test]
    fn one_type_per_subscription_and_one_exclusive_consumer() {
        use SubType::*;
        assert!(type_admits(None, Exclusive, "s").is_ok());
        assert!(type_admits(Some(Shared), Shared, "s").is_ok());
        assert!(type_admits(Some(Failover), Failover, "s").is_ok());
        let exclusive = type_admits(Some(Exclusive), Exclusive, "s").unwrap_err();
        assert!(exclusive.to_string().contains("exclusive consumer is already connected"));
        let other = type_admits(Some(Shared), KeyShared, "s").unwrap_err();
        assert!(other.to_string().contains("different type"));
    }
}
