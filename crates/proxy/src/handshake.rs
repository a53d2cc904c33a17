//! The proxy's handshake decisions, without I/O: what a client's CONNECT asks for, the CONNECT
//! the proxy sends a broker on the client's behalf, and the CONNECTED the client gets.

use bytes::Bytes;
use magnetar_protocol::commands;
use magnetar_protocol::proto::{BaseCommand, CommandConnect, CommandConnected};
use magnetar_security::Principal;

/// The proxy's version, in `proxy_version` and its own CONNECTED.
pub const PROXY_VERSION: &str = concat!("magnetar-proxy-", env!("CARGO_PKG_VERSION"));

/// The oldest protocol version the proxy serves (Pulsar's proxy: v10).
pub const MIN_PROTOCOL_VERSION: i32 = 10;
/// The newest protocol version the proxy speaks on lookup connections.
pub const PROTOCOL_VERSION: i32 = 19;

/// What a client's CONNECT asks of the proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// No `proxy_to_broker_url`: the proxy answers lookups itself.
    Lookup,
    /// Forward the connection to the broker at `host:port`.
    Direct(String),
}

/// Why a CONNECT is refused before anything else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A protocol older than [`MIN_PROTOCOL_VERSION`].
    OldProtocol(i32),
}

pub fn mode_of(connect: &CommandConnect) -> Result<Mode, Refusal> {
    let version = connect.protocol_version.unwrap_or(0);
    if version < MIN_PROTOCOL_VERSION {
        return Err(Refusal::OldProtocol(version));
    }
    match connect.proxy_to_broker_url.as_deref().map(str::trim) {
        Some(target) if !target.is_empty() => {
            Ok(Mode::Direct(crate::directory::host_port(target).to_string()))
        }
        _ => Ok(Mode::Lookup),
    }
}

/// The proxy's credentials and choices for the CONNECTs it sends brokers.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    /// The proxy's token (`token` method).
    pub token: Option<String>,
    /// Put the client's credentials in `original_auth_data`.
    pub forward_authorization_credentials: bool,
}

/// The CONNECT a broker gets for a client whose CONNECT was `client`. `principal`: the role
/// the proxy authenticated (None: the proxy does not authenticate, and the client's own
/// credentials go to the broker, which checks them).
pub fn broker_connect(
    client: &CommandConnect,
    principal: Option<&Principal>,
    credentials: &Credentials,
) -> BaseCommand {
    let mut connect = CommandConnect {
        client_version: client.client_version.clone(),
        protocol_version: client.protocol_version,
        feature_flags: client.feature_flags,
        proxy_version: Some(PROXY_VERSION.to_string()),
        ..Default::default()
    };
    match principal {
        Some(principal) => {
            if let Some(token) = &credentials.token {
                connect.auth_method_name = Some("token".into());
                connect.auth_data = Some(Bytes::from(token.clone().into_bytes()));
            }
            connect.original_principal = Some(principal.role.clone());
            if credentials.forward_authorization_credentials {
                let data = client.auth_data.as_deref().unwrap_or_default();
                connect.original_auth_data = Some(String::from_utf8_lossy(data).into_owned());
                connect.original_auth_method = client.auth_method_name.clone();
            }
        }
        None => {
            connect.auth_method_name = client.auth_method_name.clone();
            connect.auth_data = client.auth_data.clone();
        }
    }
    BaseCommand { connect: Some(Box::new(connect)), ..commands::base(Type::Connect) }
}

use magnetar_protocol::proto::base_command::Type;

/// The CONNECTED a client of a direct connection gets: the broker's, so that the protocol
/// version, the message size limit and the features are the broker's.
pub fn client_connected(broker: &CommandConnected) -> BaseCommand {
    commands::connected(
        broker.server_version.clone(),
        broker.protocol_version.unwrap_or(0),
        broker.max_message_size,
        broker.feature_flags,
    )
}

/// The CONNECTED a client of a lookup connection gets from the proxy itself.
pub fn lookup_connected(client: &CommandConnect) -> BaseCommand {
    let version = client.protocol_version.unwrap_or(0).min(PROTOCOL_VERSION);
    commands::connected(PROXY_VERSION, version, None, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(target: Option<&str>) -> CommandConnect {
        CommandConnect {
            client_version: "Pulsar-CPP-v3.5".into(),
            protocol_version: Some(20),
            auth_method_name: Some("token".into()),
            auth_data: Some(Bytes::from_static(b"client-jwt")),
            proxy_to_broker_url: target.map(str::to_string),
            ..Default::default()
        }
    }

    fn principal() -> Principal {
        Principal { role: "alice".into(), method: "token".into(), expires_at_ms: None }
    }

    #[test]
    fn a_target_makes_a_direct_connection_and_old_protocols_are_refused() {
        assert_eq!(mode_of(&client(None)), Ok(Mode::Lookup));
        assert_eq!(mode_of(&client(Some(""))), Ok(Mode::Lookup));
        assert_eq!(mode_of(&client(Some("b1:6650"))), Ok(Mode::Direct("b1:6650".into())));
        assert_eq!(mode_of(&client(Some("pulsar://b1:6650"))), Ok(Mode::Direct("b1:6650".into())));
        let old = CommandConnect { protocol_version: Some(6), ..client(None) };
        assert_eq!(mode_of(&old), Err(Refusal::OldProtocol(6)));
    }

    #[test]
    fn an_authenticated_client_is_named_and_the_proxy_shows_its_own_credentials() {
        let credentials = Credentials { token: Some("proxy-jwt".into()), ..Default::default() };
        let sent = broker_connect(&client(Some("b1:6650")), Some(&principal()), &credentials);
        let connect = sent.connect.unwrap();
        assert_eq!(connect.auth_data.as_deref(), Some(&b"proxy-jwt"[..]));
        assert_eq!(connect.original_principal.as_deref(), Some("alice"));
        assert_eq!(connect.original_auth_data, None, "not forwarded unless asked");
        assert_eq!(connect.proxy_to_broker_url, None, "the broker is the target");
        assert_eq!(connect.protocol_version, Some(20));
        assert_eq!(connect.proxy_version.as_deref(), Some(PROXY_VERSION));

        let forward = Credentials { forward_authorization_credentials: true, ..credentials };
        let connect = broker_connect(&client(None), Some(&principal()), &forward).connect.unwrap();
        assert_eq!(connect.original_auth_data.as_deref(), Some("client-jwt"));
        assert_eq!(connect.original_auth_method.as_deref(), Some("token"));
    }

    #[test]
    fn without_authentication_at_the_proxy_the_broker_checks_the_client_itself() {
        let credentials = Credentials { token: Some("proxy-jwt".into()), ..Default::default() };
        let connect = broker_connect(&client(None), None, &credentials).connect.unwrap();
        assert_eq!(connect.auth_data.as_deref(), Some(&b"client-jwt"[..]));
        assert_eq!(connect.original_principal, None);
    }

    #[test]
    fn the_client_gets_the_broker_s_connected() {
        let broker = CommandConnected {
            server_version: "magnetar-0.1.0".into(),
            protocol_version: Some(19),
            max_message_size: Some(5 << 20),
            feature_flags: None,
        };
        let connected = client_connected(&broker).connected.unwrap();
        assert_eq!(*connected, broker);
        let own = lookup_connected(&client(None)).connected.unwrap();
        assert_eq!(own.protocol_version, Some(PROTOCOL_VERSION));
    }
}
