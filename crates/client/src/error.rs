//! The client's error type.

use magnetar_protocol::proto::ServerError;

/// Everything that can go wrong in the client.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The service URL could not be parsed (expected `pulsar://host:port`).
    #[error("invalid service URL {0:?}")]
    InvalidUrl(String),
    /// A builder was given an invalid or incomplete configuration.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A socket error.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// The connection to the broker is closed.
    #[error("connection closed")]
    Disconnected,
    /// The broker sent something this client does not understand.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The broker answered a request with an error.
    #[error("broker error {code:?}: {message}")]
    Server {
        /// The error code, when known.
        code: Option<ServerError>,
        /// The broker's message.
        message: String,
    },
    /// A request got no answer in time.
    #[error("timed out waiting for {0}")]
    Timeout(&'static str),
    /// Compressing or decompressing a payload failed.
    #[error("compression error: {0}")]
    Compression(String),
    /// A message could not be encoded.
    #[error("encode error: {0}")]
    Encode(#[from] magnetar_protocol::EncodeError),
    /// The producer, consumer or reader was closed.
    #[error("closed")]
    Closed,
    /// The message is larger than the broker accepts.
    #[error("message of {size} bytes exceeds the maximum of {max}")]
    MessageTooLarge {
        /// Size of the encoded message.
        size: usize,
        /// Broker's limit.
        max: usize,
    },
    /// Lookup redirected more times than allowed.
    #[error("too many lookup redirects for {0}")]
    TooManyRedirects(String),
}

impl Error {
    /// Whether creating a producer or consumer again may succeed: what the official clients
    /// retry until their operation timeout (a broker not ready, storage unavailable, a lost
    /// connection), as against what will not change by asking again (bad credentials, no such
    /// topic, a busy producer name, a refused schema, quotas, a terminated topic).
    pub fn is_retriable(&self) -> bool {
        match self {
            Error::Io(_) | Error::Disconnected | Error::Timeout(_) => true,
            Error::Server { code: None, .. } => true,
            Error::Server { code: Some(code), .. } => matches!(
                code,
                ServerError::UnknownError
                    | ServerError::MetadataError
                    | ServerError::PersistenceError
                    | ServerError::ServiceNotReady
                    | ServerError::TooManyRequests
            ),
            Error::InvalidUrl(_)
            | Error::Config(_)
            | Error::Protocol(_)
            | Error::Compression(_)
            | Error::Encode(_)
            | Error::Closed
            | Error::MessageTooLarge { .. }
            | Error::TooManyRedirects(_) => false,
        }
    }

    pub(crate) fn server(code: i32, message: impl Into<String>) -> Self {
        Error::Server { code: ServerError::try_from(code).ok(), message: message.into() }
    }

    /// The same error again, for the next of several waiters failed by one cause (an I/O
    /// error keeps its kind and text).
    pub(crate) fn duplicate(&self) -> Self {
        match self {
            Error::InvalidUrl(s) => Error::InvalidUrl(s.clone()),
            Error::Config(s) => Error::Config(s.clone()),
            Error::Io(e) => Error::Io(std::io::Error::new(e.kind(), e.to_string())),
            Error::Disconnected => Error::Disconnected,
            Error::Protocol(s) => Error::Protocol(s.clone()),
            Error::Server { code, message } => {
                Error::Server { code: *code, message: message.clone() }
            }
            Error::Timeout(what) => Error::Timeout(what),
            Error::Compression(s) => Error::Compression(s.clone()),
            Error::Encode(e) => Error::Encode(e.clone()),
            Error::Closed => Error::Closed,
            Error::MessageTooLarge { size, max } => {
                Error::MessageTooLarge { size: *size, max: *max }
            }
            Error::TooManyRedirects(s) => Error::TooManyRedirects(s.clone()),
        }
    }
}

/// How long the official clients keep retrying the creation of a producer or consumer (their
/// `operationTimeout`), unless [`ClientOptions::operation_timeout`](crate::ClientOptions) says.
pub const DEFAULT_OPERATION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Retries of a first attach (PRODUCER or SUBSCRIBE): after a retriable error, wait (100 ms
/// doubling to 2 s) and go on until the operation timeout; any other error, or one past the
/// timeout, is the answer.
pub(crate) struct Retry {
    deadline: tokio::time::Instant,
    backoff: std::time::Duration,
}

impl Retry {
    pub(crate) fn new(timeout: std::time::Duration) -> Self {
        Retry {
            deadline: tokio::time::Instant::now() + timeout,
            backoff: std::time::Duration::from_millis(100),
        }
    }

    /// Waits before the next attempt after `error`, or hands `error` back as final.
    pub(crate) async fn after(&mut self, error: Error) -> Result<()> {
        let next = tokio::time::Instant::now() + self.backoff;
        if !error.is_retriable() || next > self.deadline {
            return Err(error);
        }
        tracing::debug!(%error, "retrying after a retriable error");
        // Backoff between attempts, not synchronisation.
        tokio::time::sleep_until(next).await;
        self.backoff = (self.backoff * 2).min(std::time::Duration::from_secs(2));
        Ok(())
    }
}

/// Shorthand for `Result<T, magnetar_client::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
