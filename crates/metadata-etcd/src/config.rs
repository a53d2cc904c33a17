//! Configuration of an [`crate::EtcdStore`], validated into the form the store uses.
//!
//! Invariants after `validate`: the root prefix is a valid metadata key (so `root + key` is a
//! clean etcd key for every valid key), every duration is positive, the session TTL is a
//! whole number of seconds (etcd leases count in seconds), and `max_value_len` does not
//! exceed the trait's compiled maximum.

use std::time::Duration;

use magnetar_metadata::{validate_key, MetadataError, Result, MAX_KEY_LEN, MAX_VALUE_LEN};

/// etcd's default `--max-request-bytes` (1.5 MiB): a default-configured etcd rejects larger
/// requests, so values near [`MAX_VALUE_LEN`] need a raised limit (see
/// [`REQUIRED_MAX_REQUEST_BYTES`]).
pub const ETCD_DEFAULT_MAX_REQUEST_BYTES: usize = 1536 * 1024;

/// Longest accepted root prefix, in bytes.
pub const MAX_ROOT_LEN: usize = 256;

/// Room for everything in one write request besides the value: a compare-and-set txn
/// names the key three times (compare, put, read-back).
const REQUEST_OVERHEAD_BYTES: usize = 64 * 1024;
const _: () = assert!(3 * (MAX_KEY_LEN + MAX_ROOT_LEN) + 4096 <= REQUEST_OVERHEAD_BYTES);

/// The `--max-request-bytes` an etcd needs so that values up to [`MAX_VALUE_LEN`] fit (the
/// test clusters of crates/etcd-testing run with it).
pub const REQUIRED_MAX_REQUEST_BYTES: usize = MAX_VALUE_LEN + REQUEST_OVERHEAD_BYTES;

/// Largest gRPC message the client decodes (a `get` of the largest value, or one watch
/// response carrying it).
pub(crate) const MAX_DECODING_MESSAGE_BYTES: usize = 2 * MAX_VALUE_LEN + REQUEST_OVERHEAD_BYTES;

/// Configuration of an [`crate::EtcdStore`].
#[derive(Debug, Clone)]
pub struct EtcdStoreConfig {
    /// etcd client endpoints (`http://127.0.0.1:2379`); requests are balanced over them.
    pub endpoints: Vec<String>,
    /// Prefix of every etcd key of this store, so several clusters share one etcd. A valid
    /// metadata key: starts with '/', no trailing '/'. Default `/magnetar/<cluster>`.
    pub root: String,
    /// Time to live of the session's lease: after this long without a successful
    /// keep-alive, etcd deletes the session's ephemeral keys and the store reports
    /// `SessionLost`. Whole seconds, at least 1 (etcd may raise it to its minimum, about
    /// 1.5 election timeouts). Default 10 s.
    pub session_ttl: Duration,
    /// Bound on one request (and on a read's retries together). Default 5 s.
    pub request_timeout: Duration,
    /// Bound on establishing the first session in `connect`. Default 10 s.
    pub connect_timeout: Duration,
    /// Keys per page of a range read (`list`, `list_children`). Default 500.
    pub list_page_size: usize,
    /// Queue length of each watch stream before it signals `Lagged`. Default 1024, min 2.
    pub watch_capacity: usize,
    /// Largest value accepted, at most [`MAX_VALUE_LEN`] (the default). etcd must run with
    /// `--max-request-bytes` of at least this plus 64 KiB ([`REQUIRED_MAX_REQUEST_BYTES`]
    /// for the default); a value etcd refuses as too large gives `ValueTooLarge` anyway.
    pub max_value_len: usize,
}

impl EtcdStoreConfig {
    /// Defaults for `cluster` (root `/magnetar/<cluster>`) on `endpoints`.
    pub fn new(endpoints: Vec<String>, cluster: &str) -> Self {
        EtcdStoreConfig {
            endpoints,
            root: format!("/magnetar/{cluster}"),
            session_ttl: Duration::from_secs(10),
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(10),
            list_page_size: 500,
            watch_capacity: magnetar_metadata::DEFAULT_WATCH_CAPACITY,
            max_value_len: MAX_VALUE_LEN,
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let invalid = |reason: &'static str| MetadataError::InvalidKey {
            key: self.root.chars().take(MAX_ROOT_LEN).collect(),
            reason,
        };
        validate_key(&self.root).map_err(|_| invalid("root must be a valid metadata key"))?;
        if self.root.len() > MAX_ROOT_LEN {
            return Err(invalid("root longer than MAX_ROOT_LEN"));
        }
        let config_error = |what: &str| {
            MetadataError::io(
                "validating the etcd store configuration",
                std::io::Error::new(std::io::ErrorKind::InvalidInput, what.to_string()),
            )
        };
        if self.endpoints.is_empty() {
            return Err(config_error("no etcd endpoints"));
        }
        if self.session_ttl.as_secs() == 0 || self.session_ttl.subsec_nanos() != 0 {
            return Err(config_error("session_ttl must be a whole number of seconds, >= 1"));
        }
        if self.request_timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(config_error("timeouts must be positive"));
        }
        if self.list_page_size < 2 {
            return Err(config_error("list_page_size must be at least 2"));
        }
        if self.max_value_len > MAX_VALUE_LEN {
            return Err(config_error("max_value_len exceeds MAX_VALUE_LEN"));
        }
        Ok(())
    }

    /// The session TTL in etcd's unit.
    pub(crate) fn ttl_seconds(&self) -> i64 {
        i64::try_from(self.session_ttl.as_secs()).unwrap_or(i64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        let ok = EtcdStoreConfig::new(vec!["http://127.0.0.1:2379".into()], "c1");
        assert_eq!(ok.root, "/magnetar/c1");
        assert!(ok.validate().is_ok());
        for root in ["", "magnetar", "/magnetar/", "/a//b", "/"] {
            let mut c = ok.clone();
            c.root = root.into();
            assert!(matches!(c.validate(), Err(MetadataError::InvalidKey { .. })), "{root:?}");
        }
        let mut c = ok.clone();
        c.session_ttl = Duration::from_millis(1500);
        assert!(c.validate().is_err());
        let mut c = ok.clone();
        c.endpoints.clear();
        assert!(c.validate().is_err());
        let mut c = ok;
        c.max_value_len = MAX_VALUE_LEN + 1;
        assert!(c.validate().is_err());
    }
}
