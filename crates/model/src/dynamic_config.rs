//! Pulsar's dynamic configuration: broker settings changed at run time through
//! `pulsar-admin brokers update-dynamic-config`, stored once for the cluster
//! ([`crate::keys::DYNAMIC_CONFIGURATION`], `{name: value}` as text, as Pulsar stores it) and
//! applied by every broker over its configuration file's values.
//!
//! Only the settings that are dynamic in Pulsar and that Magnetar has are offered ([`NAMES`]);
//! a value must parse as its setting's type to be stored.

use std::collections::BTreeMap;

/// The dynamic settings, by Pulsar's names.
pub const NAMES: &[&str] = &[
    "allowAutoSubscriptionCreation",
    "allowAutoTopicCreation",
    "dispatchThrottlingRatePerTopicInMsg",
    "dispatchThrottlingRatePerTopicInByte",
    "dispatchThrottlingRatePerSubscriptionInMsg",
    "dispatchThrottlingRatePerSubscriptionInByte",
    "maxPublishRatePerTopicInMessages",
    "maxPublishRatePerTopicInBytes",
];

/// Why a setting cannot be changed to a value; the messages are Pulsar's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DynamicConfigError {
    #[error(" Can't update non-dynamic configuration")]
    NotDynamic,
    #[error(" Invalid dynamic-config value")]
    InvalidValue,
}

/// The values the stored document overrides (`None`: the configuration file's).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DynamicValues {
    pub allow_auto_subscription_creation: Option<bool>,
    pub allow_auto_topic_creation: Option<bool>,
    pub dispatch_rate_per_topic_msg: Option<u32>,
    pub dispatch_rate_per_topic_byte: Option<u64>,
    pub dispatch_rate_per_subscription_msg: Option<u32>,
    pub dispatch_rate_per_subscription_byte: Option<u64>,
    pub publish_rate_per_topic_messages: Option<u32>,
    pub publish_rate_per_topic_bytes: Option<u64>,
}

/// Checks that `name` is dynamic and `value` parses as its type.
pub fn validate(name: &str, value: &str) -> Result<(), DynamicConfigError> {
    let mut values = DynamicValues::default();
    values.set(name, value)
}

impl DynamicValues {
    /// The values of a stored document; settings that are not dynamic, or whose value does
    /// not parse (written by hand), are left out and returned by name.
    pub fn from_document(document: &BTreeMap<String, String>) -> (DynamicValues, Vec<String>) {
        let mut values = DynamicValues::default();
        let rejected = document
            .iter()
            .filter(|(name, value)| values.set(name, value).is_err())
            .map(|(name, _)| name.clone())
            .collect();
        (values, rejected)
    }

    fn set(&mut self, name: &str, value: &str) -> Result<(), DynamicConfigError> {
        fn parse<T: std::str::FromStr>(value: &str) -> Result<Option<T>, DynamicConfigError> {
            value.trim().parse().map(Some).map_err(|_| DynamicConfigError::InvalidValue)
        }
        // Java's Boolean.parseBoolean would take anything; a typo must not silently be false.
        let boolean = |value: &str| match value.trim().to_ascii_lowercase().as_str() {
            "true" => Ok(Some(true)),
            "false" => Ok(Some(false)),
            _ => Err(DynamicConfigError::InvalidValue),
        };
        match name {
            "allowAutoSubscriptionCreation" => {
                self.allow_auto_subscription_creation = boolean(value)?
            }
            "allowAutoTopicCreation" => self.allow_auto_topic_creation = boolean(value)?,
            "dispatchThrottlingRatePerTopicInMsg" => {
                self.dispatch_rate_per_topic_msg = parse(value)?
            }
            "dispatchThrottlingRatePerTopicInByte" => {
                self.dispatch_rate_per_topic_byte = parse(value)?
            }
            "dispatchThrottlingRatePerSubscriptionInMsg" => {
                self.dispatch_rate_per_subscription_msg = parse(value)?
            }
            "dispatchThrottlingRatePerSubscriptionInByte" => {
                self.dispatch_rate_per_subscription_byte = parse(value)?
            }
            "maxPublishRatePerTopicInMessages" => {
                self.publish_rate_per_topic_messages = parse(value)?
            }
            "maxPublishRatePerTopicInBytes" => self.publish_rate_per_topic_bytes = parse(value)?,
            _ => return Err(DynamicConfigError::NotDynamic),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_settable_and_others_are_not_dynamic() {
        for name in NAMES {
            let value = if name.starts_with("allow") { "true" } else { "10" };
            assert_eq!(validate(name, value), Ok(()), "{name}");
        }
        assert_eq!(validate("maxMessageSize", "10"), Err(DynamicConfigError::NotDynamic));
        assert_eq!(
            DynamicConfigError::NotDynamic.to_string(),
            " Can't update non-dynamic configuration"
        );
    }

    #[test]
    fn values_must_parse_as_their_type() {
        assert_eq!(
            validate("allowAutoSubscriptionCreation", "yes"),
            Err(DynamicConfigError::InvalidValue)
        );
        assert_eq!(
            validate("dispatchThrottlingRatePerTopicInMsg", "-1"),
            Err(DynamicConfigError::InvalidValue)
        );
        assert_eq!(validate("allowAutoSubscriptionCreation", " TRUE "), Ok(()));
    }

    #[test]
    fn a_document_overrides_what_it_names_and_reports_what_it_cannot_use() {
        let document: BTreeMap<String, String> = [
            ("allowAutoSubscriptionCreation", "false"),
            ("dispatchThrottlingRatePerTopicInMsg", "500"),
            ("maxMessageSize", "1"),
            ("allowAutoTopicCreation", "maybe"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let (values, rejected) = DynamicValues::from_document(&document);
        assert_eq!(values.allow_auto_subscription_creation, Some(false));
        assert_eq!(values.dispatch_rate_per_topic_msg, Some(500));
        assert_eq!(values.allow_auto_topic_creation, None);
        assert_eq!(
            rejected,
            vec!["allowAutoTopicCreation".to_string(), "maxMessageSize".to_string()]
        );
    }
}
