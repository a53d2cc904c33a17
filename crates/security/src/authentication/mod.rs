//! Authentication: the `[authentication]` section and the providers Pulsar has.
//!
//! - `token` ([`token::TokenProvider`], Pulsar's `AuthenticationProviderToken`): a JWT signed
//!   with a secret key (HS256/384/512) or a private key whose public half is configured
//!   (RS256/384/512, PS256/384/512, ES256/384). The role is the claim `token_auth_claim`
//!   (`sub`); `exp` is enforced without leeway (Pulsar's default skew is 0), `nbf` too; the
//!   audience only when `token_audience` is set.
//! - `tls` (`AuthenticationProviderTls`): the verified client certificate's common name.
//! - `basic` ([`basic::BasicProvider`], `AuthenticationProviderBasic`): `user:password`
//!   checked against a users file of `user:hash` lines (crypt or APR1-MD5 hashes).
//! - anonymous: a client that sends no credentials (or a method no provider serves) is given
//!   `anonymous_user_role` when it is set, as Pulsar's `ServerCnx` does.
//!
//! Errors never carry key material, passwords or tokens: only what was wrong.

pub mod basic;
mod der;
pub mod keys;
pub mod token;

use crate::{Principal, TransportIdentity};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;

/// The `[authentication]` section of the server's configuration file.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct AuthenticationConfig {
    /// Whether clients must authenticate (Pulsar's `authenticationEnabled`, default false).
    pub enabled: bool,
    /// The providers accepted, any of `token`, `tls`, `basic` (default `["token"]`).
    pub providers: Vec<String>,
    /// HMAC secret key for tokens: `file:///path`, `data:;base64,...`, a path or base64 (raw
    /// bytes, as `magnetar tokens create-secret-key` and `pulsar tokens` write them).
    pub token_secret_key: String,
    /// Public key for tokens signed with a private key (DER or PEM, same forms).
    pub token_public_key: String,
    /// The public key's algorithm family: RS256 (RSA, default) or ES256 (EC).
    pub token_public_alg: String,
    /// The claim holding the role (default `sub`).
    pub token_auth_claim: String,
    /// The claim holding the audience (default `aud`).
    pub token_audience_claim: String,
    /// When set, a token's audience claim must contain it.
    pub token_audience: String,
    /// The basic provider's users file (`user:hash` lines; a path, `file:` or `data:` URL).
    pub basic_users_file: String,
    /// Seconds between checks of a connection's credentials for expiry (Pulsar's
    /// `authenticationRefreshCheckSeconds`, 60).
    pub refresh_check_seconds: u64,
    /// The role given to a client that presents no credentials ("" = refused).
    pub anonymous_user_role: String,
}

impl Default for AuthenticationConfig {
    fn default() -> Self {
        AuthenticationConfig {
            enabled: false,
            providers: vec!["token".into()],
            token_secret_key: String::new(),
            token_public_key: String::new(),
            token_public_alg: "RS256".into(),
            token_auth_claim: "sub".into(),
            token_audience_claim: "aud".into(),
            token_audience: String::new(),
            basic_users_file: String::new(),
            refresh_check_seconds: 60,
            anonymous_user_role: String::new(),
        }
    }
}

impl AuthenticationConfig {
    /// Checks the section: the providers are known and their keys / users files load and
    /// parse. Cheap enough to run before anything opens.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.enabled {
            Authenticator::from_config(self)?;
        }
        Ok(())
    }
}

/// A configuration the authenticator cannot be built from. Messages name the setting and what
/// is wrong with it, never the key bytes.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("authentication.providers: unknown provider {0:?} (expected token, tls or basic)")]
    UnknownProvider(String),
    #[error("authentication.providers is empty while authentication is enabled")]
    NoProvider,
    #[error("authentication.refresh_check_seconds must be at least 1")]
    RefreshCheck,
    #[error("authentication: the token provider needs token_secret_key or token_public_key")]
    NoTokenKey,
    #[error("authentication: set only one of token_secret_key and token_public_key")]
    TwoTokenKeys,
    #[error(
        "authentication.token_public_alg: {0:?} is not RS256/384/512, PS256/384/512 or ES256/384"
    )]
    PublicAlg(String),
    #[error("authentication.{setting}: {error}")]
    Key { setting: &'static str, error: keys::KeyError },
    #[error("authentication.basic_users_file: {0}")]
    Users(#[from] basic::UsersError),
    #[error("authentication: the basic provider needs basic_users_file")]
    NoUsersFile,
}

/// Why credentials were refused. The `Display` text goes to the client (and the log): what was
/// wrong, never the credential itself.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("unknown authentication method {0:?}")]
    UnknownMethod(String),
    #[error("no credentials and no anonymous role")]
    NoCredentials,
    #[error("malformed credentials: {0}")]
    Malformed(String),
    #[error("token expired")]
    Expired,
    #[error("token not valid yet")]
    NotYetValid,
    #[error("token signature is not valid")]
    BadSignature,
    #[error("token algorithm {0} is not accepted with the configured key")]
    Algorithm(String),
    #[error("token audience does not include this broker")]
    Audience,
    #[error("token has no role claim {0:?}")]
    NoRole(String),
    #[error("no verified client certificate")]
    NoClientCertificate,
    #[error("unknown user or wrong password")]
    BadPassword,
    #[error("credentials too large")]
    TooLarge,
    #[error("the role changed during a refresh")]
    RoleChanged,
}

impl AuthError {
    /// The `reason` label of `pulsar_authentication_failures_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            AuthError::UnknownMethod(_) => "UNKNOWN_METHOD",
            AuthError::NoCredentials => "NO_CREDENTIALS",
            AuthError::Malformed(_) | AuthError::TooLarge => "INVALID_AUTH_DATA",
            AuthError::Expired => "EXPIRED_TOKEN",
            AuthError::NotYetValid | AuthError::BadSignature | AuthError::Algorithm(_) => {
                "INVALID_TOKEN"
            }
            AuthError::Audience => "INVALID_AUDIENCES",
            AuthError::NoRole(_) => "INVALID_TOKEN",
            AuthError::NoClientCertificate => "INVALID_CERTIFICATE",
            AuthError::BadPassword => "INVALID_AUTH_DATA",
            AuthError::RoleChanged => "ROLE_CHANGED",
        }
    }
}

/// Largest credential looked at (a token, `user:password`): anything bigger is refused before
/// it is parsed.
pub const MAX_AUTH_DATA: usize = 64 << 10;

/// The providers built from [`AuthenticationConfig`]: turns a method name and its data into a
/// [`Principal`].
pub struct Authenticator {
    token: Option<token::TokenProvider>,
    tls: bool,
    basic: Option<basic::BasicProvider>,
    anonymous_role: Option<String>,
    refresh_check_seconds: u64,
    /// Attempts by (method, failure reason or None for a success).
    counts: Mutex<BTreeMap<(&'static str, Option<&'static str>), u64>>,
}

/// One series of the authentication counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthCount {
    /// Pulsar's provider class name (`AuthenticationProviderToken`, ...).
    pub provider_name: &'static str,
    /// `token`, `tls`, `basic`, `anonymous`, or `none` (no usable method).
    pub auth_method: &'static str,
    /// None for successes; the [`AuthError::reason`] for failures.
    pub reason: Option<&'static str>,
    pub count: u64,
}

impl fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authenticator")
            .field("token", &self.token.is_some())
            .field("tls", &self.tls)
            .field("basic", &self.basic.is_some())
            .field("anonymous_role", &self.anonymous_role)
            .finish()
    }
}

impl Authenticator {
    /// Builds the providers the section names, loading and parsing their keys.
    pub fn from_config(config: &AuthenticationConfig) -> Result<Authenticator, ConfigError> {
        if config.providers.is_empty() {
            return Err(ConfigError::NoProvider);
        }
        if config.refresh_check_seconds == 0 {
            return Err(ConfigError::RefreshCheck);
        }
        let mut authenticator = Authenticator {
            token: None,
            tls: false,
            basic: None,
            anonymous_role: (!config.anonymous_user_role.is_empty())
                .then(|| config.anonymous_user_role.clone()),
            refresh_check_seconds: config.refresh_check_seconds,
            counts: Mutex::new(BTreeMap::new()),
        };
        for provider in &config.providers {
            match provider.as_str() {
                "token" => authenticator.token = Some(token::TokenProvider::from_config(config)?),
                "tls" => authenticator.tls = true,
                "basic" => {
                    if config.basic_users_file.is_empty() {
                        return Err(ConfigError::NoUsersFile);
                    }
                    authenticator.basic =
                        Some(basic::BasicProvider::load(&config.basic_users_file)?);
                }
                other => return Err(ConfigError::UnknownProvider(other.to_string())),
            }
        }
        Ok(authenticator)
    }

    /// Seconds between expiry checks of a connection's credentials.
    pub fn refresh_check_seconds(&self) -> u64 {
        self.refresh_check_seconds
    }

    /// Whether `method` is served by a configured provider.
    pub fn has_provider(&self, method: &str) -> bool {
        match method {
            "token" => self.token.is_some(),
            "tls" => self.tls,
            "basic" => self.basic.is_some(),
            _ => false,
        }
    }

    /// Pulsar's provider class name for a method (the `provider_name` metrics label).
    pub fn provider_name(method: &str) -> &'static str {
        match method {
            "token" => "AuthenticationProviderToken",
            "tls" => "AuthenticationProviderTls",
            "basic" => "AuthenticationProviderBasic",
            "anonymous" => "AnonymousAuthentication",
            _ => "Unknown",
        }
    }

    /// Authenticates a binary-protocol CONNECT (or AUTH_RESPONSE): the method name and its
    /// data, with `now_ms` (Unix milliseconds) for token expiry. A method no provider serves
    /// (or none) falls back to the anonymous role when one is set.
    pub fn authenticate(
        &self,
        method: Option<&str>,
        data: &[u8],
        identity: &TransportIdentity,
        now_ms: u64,
    ) -> Result<Principal, AuthError> {
        let result = self.check(method, data, identity, now_ms);
        self.record(static_method(method.unwrap_or("none")), &result);
        result
    }

    /// Counts an attempt (success or failure) for `pulsar_authentication_*_total`.
    pub fn record(&self, method: &'static str, result: &Result<Principal, AuthError>) {
        let key = match result {
            Ok(principal) => (static_method(&principal.method), None),
            Err(error) => (method, Some(error.reason())),
        };
        if let Ok(mut counts) = self.counts.lock() {
            *counts.entry(key).or_insert(0) += 1;
        }
    }

    /// The counters, for `/metrics`.
    pub fn counts(&self) -> Vec<AuthCount> {
        let Ok(counts) = self.counts.lock() else { return Vec::new() };
        counts
            .iter()
            .map(|(&(auth_method, reason), &count)| AuthCount {
                provider_name: Self::provider_name(auth_method),
                auth_method,
                reason,
                count,
            })
            .collect()
    }

    fn check(
        &self,
        method: Option<&str>,
        data: &[u8],
        identity: &TransportIdentity,
        now_ms: u64,
    ) -> Result<Principal, AuthError> {
        if data.len() > MAX_AUTH_DATA {
            return Err(AuthError::TooLarge);
        }
        let method = method.unwrap_or("none");
        match method {
            "token" if self.token.is_some() => self.authenticate_token(data, now_ms),
            "tls" if self.tls => self.authenticate_tls(identity),
            "basic" if self.basic.is_some() => {
                let text = std::str::from_utf8(data)
                    .map_err(|_| AuthError::Malformed("credentials are not UTF-8".into()))?;
                self.authenticate_basic(text)
            }
            other => match &self.anonymous_role {
                Some(role) => Ok(Principal {
                    role: role.clone(),
                    method: "anonymous".into(),
                    expires_at_ms: None,
                }),
                None if other == "none" || other.is_empty() => Err(AuthError::NoCredentials),
                None => Err(AuthError::UnknownMethod(truncate(other, 64))),
            },
        }
    }

    /// Authenticates an HTTP request from its `Authorization` header (`Bearer <token>`,
    /// `Basic base64(user:password)`) or, without one, its client certificate; the anonymous
    /// role otherwise. Returns the method tried with the outcome (for metrics).
    pub fn authenticate_http(
        &self,
        authorization: Option<&[u8]>,
        identity: &TransportIdentity,
        now_ms: u64,
    ) -> (&'static str, Result<Principal, AuthError>) {
        let (method, result) = self.check_http(authorization, identity, now_ms);
        self.record(method, &result);
        (method, result)
    }

    fn check_http(
        &self,
        authorization: Option<&[u8]>,
        identity: &TransportIdentity,
        now_ms: u64,
    ) -> (&'static str, Result<Principal, AuthError>) {
        let Some(header) = authorization else {
            if self.tls && identity.client_cert_common_name.is_some() {
                return ("tls", self.authenticate_tls(identity));
            }
            return ("none", self.check(None, b"", identity, now_ms));
        };
        if header.len() > MAX_AUTH_DATA {
            return ("none", Err(AuthError::TooLarge));
        }
        let Ok(header) = std::str::from_utf8(header) else {
            return ("none", Err(AuthError::Malformed("Authorization is not UTF-8".into())));
        };
        let (scheme, rest) = header.trim().split_once(' ').unwrap_or((header.trim(), ""));
        let rest = rest.trim();
        if scheme.eq_ignore_ascii_case("bearer") && self.token.is_some() {
            ("token", self.authenticate_token(rest.as_bytes(), now_ms))
        } else if scheme.eq_ignore_ascii_case("basic") && self.basic.is_some() {
            use base64::Engine;
            let decoded = match base64::engine::general_purpose::STANDARD.decode(rest) {
                Ok(decoded) => decoded,
                Err(_) => {
                    return (
                        "basic",
                        Err(AuthError::Malformed("Basic credentials not base64".into())),
                    )
                }
            };
            let result = std::str::from_utf8(&decoded)
                .map_err(|_| AuthError::Malformed("credentials are not UTF-8".into()))
                .and_then(|text| self.authenticate_basic(text));
            ("basic", result)
        } else {
            ("none", Err(AuthError::UnknownMethod(truncate(scheme, 32))))
        }
    }

    fn authenticate_token(&self, data: &[u8], now_ms: u64) -> Result<Principal, AuthError> {
        let provider = self.token.as_ref().ok_or(AuthError::UnknownMethod("token".into()))?;
        let text = std::str::from_utf8(data)
            .map_err(|_| AuthError::Malformed("token is not UTF-8".into()))?;
        // Pulsar's clients may send the HTTP form on the binary protocol too.
        let text = text.trim();
        let text = text.strip_prefix("Bearer ").unwrap_or(text);
        provider.authenticate(text, now_ms)
    }

    fn authenticate_tls(&self, identity: &TransportIdentity) -> Result<Principal, AuthError> {
        match &identity.client_cert_common_name {
            Some(cn) if identity.tls && !cn.is_empty() => {
                Ok(Principal { role: cn.clone(), method: "tls".into(), expires_at_ms: None })
            }
            _ => Err(AuthError::NoClientCertificate),
        }
    }

    fn authenticate_basic(&self, text: &str) -> Result<Principal, AuthError> {
        let provider = self.basic.as_ref().ok_or(AuthError::UnknownMethod("basic".into()))?;
        let (user, password) = text.split_once(':').ok_or_else(|| {
            AuthError::Malformed("basic credentials are not user:password".into())
        })?;
        provider.authenticate(user, password)
    }
}

/// A method name as a label: one of the known ones, else `other`.
pub fn static_method(method: &str) -> &'static str {
    match method {
        "token" => "token",
        "tls" => "tls",
        "basic" => "basic",
        "anonymous" => "anonymous",
        "none" | "" => "none",
        _ => "other",
    }
}

/// At most `max` characters of a client-given name, for messages.
fn truncate(text: &str, max: usize) -> String {
    text.chars().take(max).filter(|c| !c.is_control()).collect()
}

#[cfg(test)]
mod tests;
