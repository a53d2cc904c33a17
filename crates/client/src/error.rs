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

/// Shorthand for `Result<T, magnetar_client::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
