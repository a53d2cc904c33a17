//! `magnetar proxy`: the proxy of `magnetar_proxy` over the cluster's etcd, with its own
//! configuration file, validated (token file read, keys loaded, TLS files checked) before any
//! socket opens.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use magnetar_metadata_etcd::{parse_metadata_url, EtcdStoreConfig};
use magnetar_security::authentication::{AuthenticationConfig, Authenticator};
use magnetar_security::tls::{ServerTls, TlsConfig};
use serde::Deserialize;

use crate::cli::ProxyArgs;
use crate::config::{ConfigError, LogSection};

/// The proxy's configuration file. Every field is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct ProxyFile {
    proxy: ProxySection,
    /// `[authentication]`: clients are authenticated at the proxy (the broker's format).
    authentication: AuthenticationConfig,
    /// `[tls]`: `pulsar+ssl://` on `broker_port_tls` (the broker's format; the web keys unused).
    tls: TlsConfig,
    log: LogSection,
}

/// `[proxy]`.
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct ProxySection {
    /// Address the listeners bind. Default `0.0.0.0`.
    bind_address: String,
    /// Binary protocol port (Pulsar's `servicePort`). Default 6650.
    port: u16,
    /// HTTP port of the admin API and HTTP lookups, sent on to the brokers (Pulsar's
    /// `webServicePort`). Default 8080.
    web_port: u16,
    /// A file holding the token the proxy shows brokers when it authenticates clients itself
    /// (Pulsar's `brokerClientAuthenticationParameters`); empty: none.
    broker_client_token_file: PathBuf,
    /// Pass each client's credentials on to the broker in `original_auth_data` (Pulsar's
    /// `forwardAuthorizationCredentials`). Default false.
    forward_authorization_credentials: bool,
    /// How long a connection to a broker may take (Pulsar's `brokerProxyConnectTimeoutMs`).
    /// Default 10000.
    broker_connect_timeout_ms: u64,
}

impl Default for ProxySection {
    fn default() -> Self {
        ProxySection {
            bind_address: "0.0.0.0".into(),
            port: 6650,
            web_port: 8080,
            broker_client_token_file: PathBuf::new(),
            forward_authorization_credentials: false,
            broker_connect_timeout_ms: 10_000,
        }
    }
}

struct Validated {
    section: ProxySection,
    config: magnetar_proxy::ProxyConfig,
    authenticator: Option<Arc<Authenticator>>,
    tls: Option<Arc<ServerTls>>,
    etcd: EtcdStoreConfig,
}

fn validate(args: &ProxyArgs) -> anyhow::Result<Validated> {
    let mut file = match &args.config {
        Some(path) => crate::config::read_toml(path)?,
        None => ProxyFile::default(),
    };
    if let Some(port) = args.port {
        file.proxy.port = port;
    }
    if let Some(port) = args.web_port {
        file.proxy.web_port = port;
    }
    if file.proxy.web_port == file.proxy.port && file.proxy.port != 0 {
        anyhow::bail!("[proxy] port and web_port are both {}", file.proxy.port);
    }
    if !(1..=600_000).contains(&file.proxy.broker_connect_timeout_ms) {
        anyhow::bail!("[proxy] broker_connect_timeout_ms must be 1..=600000");
    }
    let token = match file.proxy.broker_client_token_file.as_os_str().is_empty() {
        true => None,
        false => {
            let path = &file.proxy.broker_client_token_file;
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("[proxy] broker_client_token_file {}", path.display()))?;
            Some(text.trim().to_string())
        }
    };
    let authenticator = match file.authentication.enabled {
        true => Some(Arc::new(Authenticator::from_config(&file.authentication)?)),
        false => None,
    };
    file.tls.validate(file.proxy.port, file.proxy.web_port).map_err(ConfigError::Tls)?;
    let tls = match file.tls.enabled {
        true => Some(Arc::new(ServerTls::load(&file.tls).map_err(ConfigError::Tls)?)),
        false => None,
    };
    let endpoints = parse_metadata_url(&args.metadata).map_err(ConfigError::from)?;
    if !magnetar_model::names::is_valid_entity_name(&args.cluster) {
        return Err(ConfigError::ClusterName(args.cluster.clone()).into());
    }
    let config = magnetar_proxy::ProxyConfig {
        broker_client_token: token,
        forward_authorization_credentials: file.proxy.forward_authorization_credentials,
        broker_connect_timeout: Duration::from_millis(file.proxy.broker_connect_timeout_ms),
        ..Default::default()
    };
    let etcd = EtcdStoreConfig::new(endpoints, &args.cluster);
    Ok(Validated { section: file.proxy, config, authenticator, tls, etcd })
}

pub fn run(args: ProxyArgs) -> anyhow::Result<()> {
    let validated = validate(&args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let store = crate::server::connect_etcd(&validated.etcd, &args.cluster).await?;
        let store: Arc<dyn magnetar_metadata::MetadataStore> = Arc::new(store);
        let directory = Arc::new(magnetar_proxy::MetadataDirectory::new(store));
        let proxy = magnetar_proxy::Proxy::new(validated.config, directory, validated.authenticator);
        let bind = &validated.section.bind_address;
        let mut servers = Vec::new();
        let tls_only = validated.tls.as_ref().is_some_and(|t| !t.config().plain_ports_enabled);
        if !tls_only {
            let address = format!("{bind}:{}", validated.section.port);
            let listener = tokio::net::TcpListener::bind(&address)
                .await
                .with_context(|| format!("bind the proxy's port {address}"))?;
            println!("proxy serving pulsar://{}", listener.local_addr()?);
            servers.push(tokio::spawn(proxy.clone().serve(listener, None)));
        }
        if let Some(tls) = validated.tls.clone() {
            let address = format!("{bind}:{}", tls.config().broker_port_tls);
            let listener = tokio::net::TcpListener::bind(&address)
                .await
                .with_context(|| format!("bind the proxy's TLS port {address}"))?;
            println!("proxy serving pulsar+ssl://{}", listener.local_addr()?);
            servers.push(tokio::spawn(proxy.clone().serve(listener, Some(tls))));
        }
        let address = format!("{bind}:{}", validated.section.web_port);
        let listener = tokio::net::TcpListener::bind(&address)
            .await
            .with_context(|| format!("bind the proxy's web port {address}"))?;
        println!("proxy serving http://{}", listener.local_addr()?);
        servers.push(tokio::spawn(proxy.clone().serve_http(listener)));
        tracing::info!(cluster = %args.cluster, "proxy started: brokers found in the cluster's metadata");
        crate::shutdown_signal().await?;
        for server in servers {
            server.abort();
        }
        tracing::info!("proxy stopped");
        anyhow::Ok(())
    })
}
