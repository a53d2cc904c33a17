//! Authentication on the binary protocol: CONNECT's credentials, and their refresh.
//!
//! With `[authentication] enabled`, CONNECT's `auth_method_name` / `auth_data` go to the
//! configured providers. A refusal is answered as Pulsar's `ServerCnx` answers it: an ERROR
//! with `AuthenticationError` (request id -1), then the connection closes. The message says
//! what was wrong (expired, bad signature, unknown method, malformed), never the credential.
//!
//! Refresh (Pulsar's `refreshAuthenticationCredentials`): every `refresh_check_seconds` the
//! connection looks at its principal's expiry (the injected clock's now). Once expired, a
//! client that announced `supports_auth_refresh` is sent AUTH_CHALLENGE (its method name and
//! the data `PulsarAuthRefresh`); its AUTH_RESPONSE is validated and must name the same role,
//! and replaces the principal. No answer by the next check, a bad answer, or a client that
//! cannot refresh: the connection closes. An AUTH_RESPONSE nobody asked for is refused.

use super::{Connection, Handled};
use magnetar_protocol::commands;
use magnetar_protocol::proto::{BaseCommand, CommandConnect, ServerError};
use magnetar_security::Principal;

use std::time::Duration;

/// The request id of an ERROR that answers no request (Pulsar's -1).
const NO_REQUEST: u64 = u64::MAX;

/// The data of a refresh AUTH_CHALLENGE (Pulsar's `AuthData.REFRESH_AUTH_DATA`).
const REFRESH_AUTH_DATA: &[u8] = b"PulsarAuthRefresh";

/// A connection's refresh state.
#[derive(Debug, Default)]
pub(super) struct AuthState {
    /// CONNECT announced `supports_auth_refresh`.
    supports_refresh: bool,
    /// The protocol version the client spoke at CONNECT (AUTH_CHALLENGE carries it).
    protocol_version: i32,
    /// An AUTH_CHALLENGE was sent and not answered yet.
    challenge_pending: bool,
}

/// The timer of the expiry checks, when authentication is on.
pub(super) fn refresh_timer(
    service: &crate::service::BrokerService,
) -> Option<tokio::time::Interval> {
    let authenticator = service.config.authenticator.as_ref()?;
    let period = Duration::from_secs(authenticator.refresh_check_seconds().max(1));
    let mut interval = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    Some(interval)
}

/// The next tick of `timer`; never, without one.
pub(super) async fn tick(timer: &mut Option<tokio::time::Interval>) {
    match timer {
        Some(interval) => {
            interval.tick().await;
        }
        None => std::future::pending::<()>().await,
    }
}

impl Connection {
    /// Checks CONNECT's credentials when authentication is on and sets the principal. `Err`:
    /// refused (the ERROR is sent), the connection closes.
    pub(super) fn authenticate_connect(&mut self, connect: &CommandConnect) -> Handled {
        let Some(authenticator) = self.service.config.authenticator.clone() else {
            return Ok(());
        };
        let method = connect.auth_method_name.as_deref().filter(|m| !m.is_empty());
        let data = connect.auth_data.as_deref().unwrap_or_default();
        let now_ms = self.service.ledgers.clock.now_ms();
        match authenticator.authenticate(method, data, &self.identity, now_ms) {
            Ok(principal) => {
                let principal = match self.acting_for(connect, principal) {
                    Ok(principal) => principal,
                    Err(why) => {
                        self.refuse_auth(&why);
                        return Err(why);
                    }
                };
                tracing::debug!(peer = %self.peer, role = %principal.role,
                    method = %principal.method, "authenticated");
                self.auth.supports_refresh = connect
                    .feature_flags
                    .as_ref()
                    .and_then(|f| f.supports_auth_refresh)
                    .unwrap_or(false);
                self.auth.protocol_version = connect.protocol_version.unwrap_or(0);
                self.principal = Some(principal);
                Ok(())
            }
            Err(error) => {
                let method = method.unwrap_or("none").chars().take(32).collect::<String>();
                let now_ms = self.service.ledgers.clock.now_ms();
                magnetar_clock::warn_limited!(now_ms, peer = %self.peer, %method, %error,
                    "authentication failed");
                self.refuse_auth(&error.to_string());
                Err(format!("authentication failed: {error}"))
            }
        }
    }

    /// The principal a connection acts as: a proxy's (a role of `proxy_roles`) acts for the
    /// client it names in `original_principal`, keeping its own credential's expiry (a refresh
    /// is the client's, passed through the proxy). A proxy naming another proxy is refused;
    /// another role's `original_principal` is ignored, with a warning: it acts as itself.
    fn acting_for(
        &self,
        connect: &CommandConnect,
        principal: Principal,
    ) -> Result<Principal, String> {
        let Some(original) = connect.original_principal.as_deref().filter(|p| !p.is_empty()) else {
            return Ok(principal);
        };
        let proxies = &self.service.config.authorization.proxy_roles;
        if !proxies.contains(&principal.role) {
            let now_ms = self.service.ledgers.clock.now_ms();
            magnetar_clock::warn_limited!(now_ms, peer = %self.peer, role = %principal.role,
                "original_principal from a role that is not a proxy role: ignored");
            return Ok(principal);
        }
        if proxies.iter().any(|p| p == original) {
            return Err(format!("Invalid roles: {original} is a proxy role"));
        }
        tracing::debug!(peer = %self.peer, proxy = %principal.role, role = original,
            "connection through a proxy");
        Ok(Principal { role: original.to_string(), ..principal })
    }

    /// Sends the ERROR that ends a connection whose authentication failed.
    pub(super) fn refuse_auth(&self, why: &str) {
        let message = format!("Unable to authenticate: {why}");
        self.outbox.send_command(&commands::error(
            NO_REQUEST,
            ServerError::AuthenticationError,
            message,
        ));
    }

    /// The periodic expiry check. `Err`: the connection must close.
    pub(super) fn check_credentials(&mut self) -> Handled {
        let Some(principal) = &self.principal else { return Ok(()) };
        let Some(expires_at_ms) = principal.expires_at_ms else { return Ok(()) };
        let now_ms = self.service.ledgers.clock.now_ms();
        if now_ms <= expires_at_ms {
            return Ok(());
        }
        if self.auth.challenge_pending {
            self.refuse_auth("credentials expired and not refreshed in time");
            return Err("authentication refresh timed out".into());
        }
        if !self.auth.supports_refresh {
            self.refuse_auth("credentials expired (the client cannot refresh them)");
            return Err("credentials expired; client does not support refresh".into());
        }
        let challenge = commands::auth_challenge(
            super::SERVER_VERSION,
            principal.method.clone(),
            bytes::Bytes::from_static(REFRESH_AUTH_DATA),
            self.auth.protocol_version.clamp(0, super::PROTOCOL_VERSION),
        );
        self.outbox.send_command(&challenge);
        self.auth.challenge_pending = true;
        tracing::debug!(peer = %self.peer, role = %principal.role, "credentials expired; challenge sent");
        Ok(())
    }

    /// AUTH_RESPONSE (authentication on): the answer to our challenge, else refused.
    pub(super) fn on_auth_response(&mut self, command: &BaseCommand) -> Handled {
        let Some(authenticator) = self.service.config.authenticator.clone() else {
            return Ok(());
        };
        if !self.auth.challenge_pending {
            self.refuse_auth("AUTH_RESPONSE without a challenge");
            return Err("unsolicited AUTH_RESPONSE".into());
        }
        self.auth.challenge_pending = false;
        let response = command.auth_response.as_ref().and_then(|r| r.response.as_ref());
        let Some(response) = response else {
            self.refuse_auth("AUTH_RESPONSE without auth data");
            return Err("AUTH_RESPONSE without auth data".into());
        };
        let Some(current) = self.principal.clone() else {
            self.refuse_auth("AUTH_RESPONSE without a session");
            return Err("AUTH_RESPONSE without a principal".into());
        };
        let method = response.auth_method_name.as_deref().unwrap_or(current.method.as_str());
        let data = response.auth_data.as_deref().unwrap_or_default();
        let now_ms = self.service.ledgers.clock.now_ms();
        let result = if method != current.method {
            Err(magnetar_security::authentication::AuthError::UnknownMethod(
                method.chars().take(32).collect(),
            ))
        } else {
            authenticator.authenticate(Some(method), data, &self.identity, now_ms).and_then(
                |principal| {
                    if principal.role == current.role {
                        Ok(principal)
                    } else {
                        let error = magnetar_security::authentication::AuthError::RoleChanged;
                        let label = magnetar_security::authentication::static_method(method);
                        authenticator.record(label, &Err(error.clone()));
                        Err(error)
                    }
                },
            )
        };
        match result {
            Ok(principal) => {
                tracing::debug!(peer = %self.peer, role = %principal.role, "credentials refreshed");
                self.principal = Some(principal);
                Ok(())
            }
            Err(error) => {
                magnetar_clock::warn_limited!(now_ms, peer = %self.peer, %error,
                    "authentication refresh failed");
                self.refuse_auth(&error.to_string());
                Err(format!("authentication refresh failed: {error}"))
            }
        }
    }
}
