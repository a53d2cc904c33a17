//! `magnetar proxy`: one address for Pulsar clients that cannot reach every broker (Kubernetes
//! ingress, another network), after Pulsar's proxy.
//!
//! A client connects to the proxy as to a broker. Its first connection is a *lookup* connection
//! (CONNECT without `proxy_to_broker_url`): the proxy answers CONNECTED itself and serves LOOKUP
//! by asking a broker (round robin over the registered brokers) and following its redirects to
//! the owner, then answers `Connect` to the owner's URL with `proxy_through_service_url`, which
//! tells the client to reach that broker through the proxy; PARTITIONED_METADATA,
//! GET_TOPICS_OF_NAMESPACE and GET_SCHEMA are forwarded to a broker and their answers relayed.
//! The client's next connection names the owner in `proxy_to_broker_url` (a *direct*
//! connection): the proxy checks that it is a registered broker (the proxy is no open relay),
//! connects to it with a CONNECT of its own, answers the client with the broker's CONNECTED, and
//! from then on copies bytes both ways: producing and consuming cost the proxy no decoding.
//!
//! Authentication happens at the proxy when `[authentication]` is on: the client's credentials
//! are checked here, and the proxy connects to brokers with its own (`broker_client_token`),
//! naming the client in `original_principal` (and, with `forward_authorization_credentials`,
//! its credentials in `original_auth_data`), as Pulsar's proxy does; a broker takes the original
//! principal only from a role in its `proxy_roles`. Without authentication at the proxy, the
//! client's credentials go to the broker as they are, and the broker checks them.
//!
//! The HTTP side (`http`): the admin API and HTTP lookups sent on to a broker, its 307s to a
//! topic's owner followed by the proxy, so `pulsar-admin` given the proxy's URL works.
//!
//! Sans-IO parts: [`handshake`] (what to do with a CONNECT, the CONNECT the broker gets, the
//! CONNECTED the client gets) and [`request_ids`] (a forwarded request's id, rewritten both
//! ways). The shell: [`directory`] (the registered brokers), `link` (a proxy-to-broker
//! connection for lookups) and `connection` (one client connection).

pub mod directory;
pub mod handshake;
pub mod request_ids;

mod connection;
mod http;
mod link;

use std::sync::Arc;
use std::time::Duration;

use magnetar_security::authentication::Authenticator;
use magnetar_security::tls::ServerTls;
use tokio::net::TcpListener;

pub use directory::{Directory, MetadataDirectory, StaticDirectory};

/// The proxy's settings. Defaults in [`Default`].
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// The proxy's own token, sent to brokers when it authenticates clients itself (Pulsar's
    /// `brokerClientAuthenticationParameters` of the token plugin). None: no credentials.
    pub broker_client_token: Option<String>,
    /// Pass the client's credentials on in `original_auth_data` (Pulsar's
    /// `forwardAuthorizationCredentials`). Default false.
    pub forward_authorization_credentials: bool,
    /// How long a connection to a broker may take to connect and answer CONNECTED. Default 10 s
    /// (Pulsar's `brokerProxyConnectTimeoutMs`).
    pub broker_connect_timeout: Duration,
    /// How long a forwarded lookup, metadata or schema request may wait for its answer.
    /// Default 30 s (the clients' operation timeout).
    pub request_timeout: Duration,
    /// How long a client has to send CONNECT (and be authenticated). Default 30 s.
    pub handshake_timeout: Duration,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            broker_client_token: None,
            forward_authorization_credentials: false,
            broker_connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            handshake_timeout: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("no broker is registered in the cluster")]
    NoBroker,
    #[error("cannot reach broker {broker}: {cause}")]
    BrokerUnreachable { broker: String, cause: String },
    #[error("broker {broker} refused the connection: {message}")]
    BrokerRefused { broker: String, error: magnetar_protocol::proto::ServerError, message: String },
    #[error("broker {0} did not answer in time")]
    BrokerTimeout(String),
    #[error("the connection to broker {0} closed")]
    BrokerClosed(String),
    #[error("the broker list could not be read: {0}")]
    Directory(String),
    #[error("malformed frame: {0}")]
    Frame(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// What every client connection of one proxy shares.
pub struct Proxy {
    config: ProxyConfig,
    brokers: directory::Brokers,
    credentials: handshake::Credentials,
    authenticator: Option<Arc<Authenticator>>,
}

impl Proxy {
    pub fn new(
        config: ProxyConfig,
        directory: Arc<dyn Directory>,
        authenticator: Option<Arc<Authenticator>>,
    ) -> Arc<Proxy> {
        let credentials = handshake::Credentials {
            token: config.broker_client_token.clone(),
            forward_authorization_credentials: config.forward_authorization_credentials,
        };
        let brokers = directory::Brokers::new(directory);
        Arc::new(Proxy { config, brokers, credentials, authenticator })
    }

    /// Serves clients on `listener` (TLS when `tls` is given) until the task is dropped.
    pub async fn serve(self: Arc<Self>, listener: TcpListener, tls: Option<Arc<ServerTls>>) {
        loop {
            let (socket, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: the listener itself stays.
                    tracing::warn!(%error, "proxy: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let _ = socket.set_nodelay(true);
            let this = self.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let peer = peer.to_string();
                match tls {
                    Some(tls) => {
                        let Some((stream, identity)) =
                            magnetar_security::tls::accept(&tls, socket, &peer).await
                        else {
                            return;
                        };
                        connection::serve(this, stream, peer, identity).await
                    }
                    None => connection::serve(this, socket, peer, Default::default()).await,
                }
            });
        }
    }
}
