//! Classifies etcd client errors into what the store does with them.
//!
//! The only distinction that matters for correctness is whether a failed write may have
//! been applied. etcd rejections that happen before a proposal is made (lease not found,
//! request too large, compacted revision) are definite; a connection that was refused never
//! carried the request; everything else (timeouts, resets, "leader changed", "no leader")
//! leaves the outcome unknown and becomes `MetadataError::Io` for a write.

use std::error::Error as _;
use std::io;

use etcd_client::Error as EtcdError;
use tonic::Code;

/// What an etcd error means for the request that got it.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The lease named by the request does not exist (expired or revoked). Nothing applied.
    LeaseNotFound,
    /// etcd refused the request as larger than its `--max-request-bytes`. Nothing applied.
    TooLarge,
    /// The requested revision was compacted away. Nothing applied (reads only).
    Compacted,
    /// The request was never sent (connection refused): safe to retry, even a write.
    NotSent(String),
    /// The cluster was unreachable or did not answer: a read may be retried, a write's
    /// outcome is unknown.
    Unavailable(io::ErrorKind, String),
}

impl Failure {
    /// Whether a read may simply be retried.
    pub(crate) fn is_retryable(&self) -> bool {
        matches!(self, Failure::NotSent(_) | Failure::Unavailable(..))
    }

    pub(crate) fn message(&self) -> String {
        match self {
            Failure::LeaseNotFound => "etcd: requested lease not found".into(),
            Failure::TooLarge => "etcd: request is too large".into(),
            Failure::Compacted => "etcd: required revision has been compacted".into(),
            Failure::NotSent(m) | Failure::Unavailable(_, m) => m.clone(),
        }
    }

    pub(crate) fn io_kind(&self) -> io::ErrorKind {
        match self {
            Failure::NotSent(_) => io::ErrorKind::ConnectionRefused,
            Failure::Unavailable(kind, _) => *kind,
            _ => io::ErrorKind::Other,
        }
    }

    pub(crate) fn timed_out() -> Failure {
        Failure::Unavailable(io::ErrorKind::TimedOut, "etcd request timed out".into())
    }
}

/// True when the error chain shows the TCP connection was refused (nothing was sent).
fn connection_refused(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<io::Error>() {
            if io.kind() == io::ErrorKind::ConnectionRefused {
                return true;
            }
        }
        cur = err.source();
    }
    false
}

pub(crate) fn classify(e: &EtcdError) -> Failure {
    match e {
        EtcdError::GRpcStatus(status) => {
            let msg = status.message();
            match status.code() {
                Code::NotFound if msg.contains("lease not found") => Failure::LeaseNotFound,
                Code::InvalidArgument if msg.contains("too large") => Failure::TooLarge,
                Code::OutOfRange if msg.contains("compacted") => Failure::Compacted,
                Code::Unavailable
                    if connection_refused(status)
                        || msg.contains("Connection refused")
                        || msg.contains("tcp connect error") =>
                {
                    Failure::NotSent(format!("etcd: {msg}"))
                }
                Code::DeadlineExceeded => {
                    Failure::Unavailable(io::ErrorKind::TimedOut, format!("etcd: {msg}"))
                }
                code => Failure::Unavailable(
                    io::ErrorKind::Other,
                    format!("etcd: {msg} (gRPC {code:?})"),
                ),
            }
        }
        EtcdError::LeaseKeepAliveError(msg) if msg.contains("lease not found") => {
            Failure::LeaseNotFound
        }
        EtcdError::TransportError(t) if connection_refused(t) => {
            Failure::NotSent(format!("etcd: {t}"))
        }
        other => {
            let refused = other.source().is_some_and(connection_refused);
            let msg = format!("etcd: {other}");
            if refused {
                Failure::NotSent(msg)
            } else {
                Failure::Unavailable(io::ErrorKind::Other, msg)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: Code, message: &str) -> EtcdError {
        EtcdError::GRpcStatus(tonic::Status::new(code, message))
    }

    #[test]
    fn etcd_rejections_are_definite_and_the_rest_unknown() {
        let lease = status(Code::NotFound, "etcdserver: requested lease not found");
        assert!(matches!(classify(&lease), Failure::LeaseNotFound));
        let big = status(Code::InvalidArgument, "etcdserver: request is too large");
        assert!(matches!(classify(&big), Failure::TooLarge));
        let old =
            status(Code::OutOfRange, "etcdserver: mvcc: required revision has been compacted");
        assert!(matches!(classify(&old), Failure::Compacted));
        let refused = status(Code::Unavailable, "tcp connect error");
        assert!(matches!(classify(&refused), Failure::NotSent(_)));
        assert!(classify(&refused).is_retryable());
        for unknown in [
            status(Code::Unavailable, "etcdserver: leader changed"),
            status(Code::Unavailable, "error reading a body from connection"),
            status(Code::Unknown, "etcdserver: request timed out"),
        ] {
            let f = classify(&unknown);
            assert!(matches!(f, Failure::Unavailable(..)), "{unknown}: {f:?}");
            assert!(f.is_retryable(), "reads retry it; writes report Io");
        }
        let deadline = classify(&status(Code::DeadlineExceeded, "context deadline exceeded"));
        assert_eq!(deadline.io_kind(), io::ErrorKind::TimedOut);
        let keep_alive = EtcdError::LeaseKeepAliveError("lease not found".into());
        assert!(matches!(classify(&keep_alive), Failure::LeaseNotFound));
    }
}
