//! Security for both front doors (the Pulsar protocol and the HTTP admin API).
//!
//! - [`tls`]: rustls server configuration from PEM files (certificate chain, key, optional
//!   trust store for client certificates), reloaded when the files change, and what a
//!   handshake tells about the peer ([`TransportIdentity`]).
//! - [`authentication`]: the providers Pulsar has (`token`: JWT HS256/RS256/ES256, `tls`: the
//!   client certificate's CN, `basic`), turning credentials into a [`Principal`].
//! - [`authorization`]: who may do what (super-users, tenant admins, namespace / topic /
//!   subscription permissions), decided as Pulsar's `PulsarAuthorizationProvider` decides.
//!
//! The types here are the contract between the transport, authentication and authorization:
//! a connection or request carries a [`TransportIdentity`] from its listener and, once
//! authenticated, a [`Principal`].

pub mod authentication;
pub mod authorization;
pub mod tls;
mod tls_v1;

/// What the transport knows about a peer before any credential is looked at.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TransportIdentity {
    /// The connection is TLS.
    pub tls: bool,
    /// The subject common name of the client certificate, when one was presented and verified
    /// against the trust store (mTLS).
    pub client_cert_common_name: Option<String>,
}

/// The caller, once authenticated (or admitted as the anonymous role).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// The role permissions are granted to (a token's `sub`, a certificate's CN, a user name).
    pub role: String,
    /// The provider that admitted it: `token`, `tls`, `basic` or `anonymous`.
    pub method: String,
    /// When the credential expires (Unix milliseconds), for a token with `exp`.
    pub expires_at_ms: Option<u64>,
}
