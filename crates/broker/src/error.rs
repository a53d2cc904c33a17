//! Broker errors and their one mapping to the protocol's `ServerError`.

use magnetar_ledger::LedgerError;
use magnetar_metadata::MetadataError;
use magnetar_protocol::proto::ServerError;

#[derive(Debug, Clone, thiserror::Error)]
pub enum BrokerError {
    #[error("invalid topic name {0:?}")]
    InvalidTopicName(String),
    #[error("topic {0} not found")]
    TopicNotFound(String),
    #[error("{0}")]
    ConsumerBusy(String),
    #[error("{0}")]
    ProducerBusy(String),
    /// An exclusive producer lost the topic (another holds it, or its epoch is behind).
    #[error("{0}")]
    ProducerFenced(String),
    /// A request that may be retried later (a producer id still being created).
    #[error("{0}")]
    ServiceNotReady(String),
    /// The topic lost a compare-and-set on its metadata: another broker owns it now.
    #[error("{0}")]
    Fenced(String),
    /// A compare-and-set found another version (not fencing by itself: the caller decides).
    #[error("metadata conflict: {0}")]
    MetadataConflict(String),
    /// Key_Shared: the consumer's hash ranges cannot be assigned (overlap, out of bounds).
    #[error("{0}")]
    ConsumerAssign(String),
    /// The message says which (see [`BrokerError::no_subscription`]).
    #[error("{0}")]
    SubscriptionNotFound(String),
    #[error("{0}")]
    NotAllowed(String),
    #[error("{0}")]
    InvalidRequest(String),
    #[error("storage: {0}")]
    Storage(#[from] LedgerError),
    #[error("metadata: {0}")]
    Metadata(String),
    /// Topic compaction: a run failed, or the compacted view could not be read.
    #[error("compaction: {0}")]
    Compaction(String),
    #[error("broker is shutting down")]
    ShuttingDown,
    #[error("{0}")]
    IncompatibleSchema(String),
    /// The topic was terminated: nothing more may be published to it.
    #[error("{0}")]
    TopicTerminated(String),
    /// A backlog quota with the `producer_request_hold` policy is exceeded: the client retries.
    #[error("{0}")]
    ProducerBlockedQuotaExceededError(String),
    /// A backlog quota with the `producer_exception` policy is exceeded: the client fails.
    #[error("{0}")]
    ProducerBlockedQuotaExceededException(String),
    /// The caller's role may not do this (authorization).
    #[error("{0}")]
    Unauthorized(String),
}

impl From<magnetar_compaction::CompactionError> for BrokerError {
    fn from(error: magnetar_compaction::CompactionError) -> Self {
        BrokerError::Compaction(error.to_string())
    }
}

impl From<magnetar_model::schema::SchemaError> for BrokerError {
    fn from(error: magnetar_model::schema::SchemaError) -> Self {
        use magnetar_model::schema::SchemaError;
        match error {
            // Pulsar answers both with IncompatibleSchema.
            SchemaError::Incompatible(why) | SchemaError::Invalid(why) => {
                BrokerError::IncompatibleSchema(why)
            }
            SchemaError::Metadata(why) => BrokerError::Metadata(why),
        }
    }
}

impl From<MetadataError> for BrokerError {
    fn from(error: MetadataError) -> Self {
        match error {
            MetadataError::BadVersion { .. } => BrokerError::MetadataConflict(error.to_string()),
            other => BrokerError::Metadata(other.to_string()),
        }
    }
}

impl BrokerError {
    /// Subscription `name` does not exist.
    pub fn no_subscription(name: &str) -> BrokerError {
        BrokerError::SubscriptionNotFound(format!("subscription {name} not found"))
    }

    /// The protocol error a client sees. Exhaustive on purpose: a new variant must choose.
    pub fn server_error(&self) -> ServerError {
        match self {
            BrokerError::InvalidTopicName(_) => ServerError::InvalidTopicName,
            BrokerError::TopicNotFound(_) => ServerError::TopicNotFound,
            BrokerError::ConsumerBusy(_) => ServerError::ConsumerBusy,
            BrokerError::ProducerBusy(_) => ServerError::ProducerBusy,
            BrokerError::ProducerFenced(_) => ServerError::ProducerFenced,
            BrokerError::ServiceNotReady(_) => ServerError::ServiceNotReady,
            // Clients reconnect (and look the topic up again) on ServiceNotReady.
            BrokerError::Fenced(_) => ServerError::ServiceNotReady,
            BrokerError::MetadataConflict(_) => ServerError::MetadataError,
            BrokerError::ConsumerAssign(_) => ServerError::ConsumerAssignError,
            BrokerError::SubscriptionNotFound(_) => ServerError::SubscriptionNotFound,
            BrokerError::NotAllowed(_) => ServerError::NotAllowedError,
            BrokerError::InvalidRequest(_) => ServerError::UnknownError,
            BrokerError::Storage(LedgerError::Journal(_)) => ServerError::PersistenceError,
            BrokerError::Storage(_) => ServerError::PersistenceError,
            BrokerError::Metadata(_) => ServerError::MetadataError,
            BrokerError::Compaction(_) => ServerError::PersistenceError,
            BrokerError::ShuttingDown => ServerError::ServiceNotReady,
            BrokerError::IncompatibleSchema(_) => ServerError::IncompatibleSchema,
            BrokerError::TopicTerminated(_) => ServerError::TopicTerminatedError,
            BrokerError::ProducerBlockedQuotaExceededError(_) => {
                ServerError::ProducerBlockedQuotaExceededError
            }
            BrokerError::ProducerBlockedQuotaExceededException(_) => {
                ServerError::ProducerBlockedQuotaExceededException
            }
            BrokerError::Unauthorized(_) => ServerError::AuthorizationError,
        }
    }
}
