//! TLS for both listeners (the Pulsar protocol and the admin API), with rustls.
//!
//! [`TlsConfig`] is the `[tls]` section of the configuration file. [`ServerTls::load`] validates
//! it (every file read and parsed: a PEM certificate chain, a PEM private key, optionally PEM
//! CAs for client certificates) into a rustls `ServerConfig`; a bad file is a typed
//! [`TlsError`] that names the file and says what is wrong, before any listener opens.
//!
//! Reload (Pulsar's `tlsCertRefreshCheckDurationSec`): [`ServerTls::acceptor`], called once per
//! accepted connection (in the connection's own task, not in the accept loop), looks at the
//! files' modification times at most every `cert_refresh_check_seconds`; when one changed it
//! builds a new `ServerConfig` from the files, which new connections then use (open ones keep
//! theirs). A new file that does not load keeps the previous configuration and logs a warning.
//!
//! Client certificates (mTLS): with `trust_certs_file`, the server asks for a certificate and
//! verifies it against those CAs (`WebPkiClientVerifier`). A client that presents an untrusted
//! certificate is refused; a client without one is admitted unless
//! `require_trusted_client_cert` (Pulsar's `tlsRequireTrustedClientCertOnConnect`).
//! [`transport_identity`] reads the verified certificate's subject CN into a
//! [`TransportIdentity`] (authentication's `tls` provider makes it the role).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection, SupportedProtocolVersion};
use serde::Deserialize;
use thiserror::Error;

use crate::TransportIdentity;

/// The client configuration [`client_config`] builds (rustls'), named here so that callers
/// need no rustls of their own.
pub type ClientConfig = rustls::ClientConfig;

/// How long a client has to finish the TLS handshake before its connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The `[tls]` section of the configuration file.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// Serve TLS: `pulsar+ssl://` on `broker_port_tls`, HTTPS on `web_port_tls`.
    pub enabled: bool,
    /// The server's PEM certificate chain (its own certificate first).
    pub cert_file: PathBuf,
    /// The server's PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// PEM CAs client certificates are verified against; empty: no client certificate asked.
    pub trust_certs_file: PathBuf,
    /// Refuse clients without a trusted certificate (Pulsar's
    /// `tlsRequireTrustedClientCertOnConnect`); needs `trust_certs_file`.
    pub require_trusted_client_cert: bool,
    /// Port of `pulsar+ssl://` (Pulsar's `brokerServicePortTls`); 0 picks a free port.
    pub broker_port_tls: u16,
    /// Port of the HTTPS admin API (Pulsar's `webServicePortTls`); 0 picks a free port.
    pub web_port_tls: u16,
    /// Seconds between looks at the files' modification times (Pulsar's
    /// `tlsCertRefreshCheckDurationSec`); 0 looks at every new connection.
    pub cert_refresh_check_seconds: u64,
    /// TLS versions offered: any of `TLSv1.3`, `TLSv1.2`.
    pub protocols: Vec<String>,
    /// Keep the plain-text ports (`broker_port`, `web_port`) open next to the TLS ones.
    pub plain_ports_enabled: bool,
    /// Storage nodes only: serve plain-text clients too, on the same port (a TLS client's
    /// first byte, a handshake record's 0x16, tells them apart), so that brokers can move to
    /// TLS one at a time. Off: TLS clients only. Brokers ignore it (their plain port is
    /// `plain_ports_enabled`).
    pub storage_plain_clients: bool,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            enabled: false,
            cert_file: PathBuf::new(),
            key_file: PathBuf::new(),
            trust_certs_file: PathBuf::new(),
            require_trusted_client_cert: false,
            broker_port_tls: 6651,
            web_port_tls: 8443,
            cert_refresh_check_seconds: 300,
            protocols: vec!["TLSv1.3".into(), "TLSv1.2".into()],
            plain_ports_enabled: true,
            storage_plain_clients: false,
        }
    }
}

/// A `[tls]` section or TLS file that cannot be used. Each names the file or key at fault.
#[derive(Debug, Error)]
pub enum TlsError {
    #[error("[tls] {key} is required when TLS is enabled")]
    Missing { key: &'static str },
    #[error("[tls] cannot read {what} {path}: {cause}")]
    Read { what: &'static str, path: PathBuf, cause: std::io::Error },
    #[error("[tls] {what} {path} is not valid PEM: {cause}")]
    BadPem { what: &'static str, path: PathBuf, cause: String },
    #[error("[tls] {what} {path} holds no {expected}")]
    Empty { what: &'static str, path: PathBuf, expected: &'static str },
    #[error("[tls] key_file {key} does not match the certificate of cert_file {cert}: {cause}")]
    KeyMismatch { cert: PathBuf, key: PathBuf, cause: String },
    #[error("[tls] trust_certs_file {path}: {cause}")]
    BadTrust { path: PathBuf, cause: String },
    #[error("[tls] unknown protocol {0:?} in protocols (use TLSv1.3, TLSv1.2)")]
    UnknownProtocol(String),
    #[error("[tls] protocols is empty")]
    NoProtocols,
    #[error("[tls] require_trusted_client_cert needs trust_certs_file")]
    RequireWithoutTrust,
    #[error("[tls] plain_ports_enabled = false needs enabled = true (no listener would be left)")]
    NoListener,
    #[error("[tls] storage_plain_clients needs enabled = true (plain-text clients are all it serves without)")]
    PlainClientsWithoutTls,
    #[error("[tls] {a} and {b} are both port {port}: each listener needs its own port")]
    PortClash { a: &'static str, b: &'static str, port: u16 },
    #[error("[tls] cannot build the TLS configuration: {0}")]
    Rustls(String),
}

impl TlsConfig {
    /// Checks what can be checked without reading files: ports distinct from each other and from
    /// the plain ports (`0`, any free port, never clashes), protocols known, a listener left.
    pub fn validate(&self, broker_port: u16, web_port: u16) -> Result<(), TlsError> {
        if !self.enabled {
            if self.storage_plain_clients {
                return Err(TlsError::PlainClientsWithoutTls);
            }
            return if self.plain_ports_enabled { Ok(()) } else { Err(TlsError::NoListener) };
        }
        if self.cert_file.as_os_str().is_empty() {
            return Err(TlsError::Missing { key: "cert_file" });
        }
        if self.key_file.as_os_str().is_empty() {
            return Err(TlsError::Missing { key: "key_file" });
        }
        if self.require_trusted_client_cert && self.trust_certs_file.as_os_str().is_empty() {
            return Err(TlsError::RequireWithoutTrust);
        }
        self.versions()?;
        let mut ports =
            vec![("broker_port_tls", self.broker_port_tls), ("web_port_tls", self.web_port_tls)];
        if self.plain_ports_enabled {
            ports.push(("broker_port", broker_port));
            ports.push(("web_port", web_port));
        }
        for (i, (a, port)) in ports.iter().enumerate() {
            for (b, other) in &ports[i + 1..] {
                if *port != 0 && port == other {
                    return Err(TlsError::PortClash { a, b, port: *port });
                }
            }
        }
        Ok(())
    }

    fn versions(&self) -> Result<Vec<&'static SupportedProtocolVersion>, TlsError> {
        let mut versions: Vec<&'static SupportedProtocolVersion> = Vec::new();
        for name in &self.protocols {
            let version = match name.as_str() {
                "TLSv1.3" => &rustls::version::TLS13,
                "TLSv1.2" => &rustls::version::TLS12,
                other => return Err(TlsError::UnknownProtocol(other.to_string())),
            };
            if !versions.iter().any(|v| v.version == version.version) {
                versions.push(version);
            }
        }
        if versions.is_empty() {
            return Err(TlsError::NoProtocols);
        }
        Ok(versions)
    }

    /// Reads the files and builds the rustls server configuration (both listeners use it).
    pub fn server_config(&self) -> Result<ServerConfig, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = read_certs(&self.cert_file, "cert_file")?;
        let key = read_key(&self.key_file)?;
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&self.versions()?)
            .map_err(|e| TlsError::Rustls(e.to_string()))?;
        let builder = if self.trust_certs_file.as_os_str().is_empty() {
            builder.with_no_client_auth()
        } else {
            let path = &self.trust_certs_file;
            let mut roots = RootCertStore::empty();
            let trusted = read_certs(path, "trust_certs_file")?;
            for cert in trusted.iter().cloned() {
                roots
                    .add(cert)
                    .map_err(|e| TlsError::BadTrust { path: path.clone(), cause: e.to_string() })?;
            }
            let algorithms = provider.signature_verification_algorithms;
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = if self.require_trusted_client_cert {
                verifier
            } else {
                verifier.allow_unauthenticated()
            };
            let verifier = verifier
                .build()
                .map_err(|e| TlsError::BadTrust { path: path.clone(), cause: e.to_string() })?;
            // X.509 v1 client certificates too (webpki takes v3 only; Pulsar's Java stack
            // takes both): see `tls_v1`.
            let verifier = crate::tls_v1::V1TolerantVerifier::new(verifier, trusted, algorithms);
            builder.with_client_cert_verifier(Arc::new(verifier))
        };
        let mut config =
            builder.with_single_cert(chain, key).map_err(|e| TlsError::KeyMismatch {
                cert: self.cert_file.clone(),
                key: self.key_file.clone(),
                cause: e.to_string(),
            })?;
        // The binary protocol has no ALPN; HTTPS is HTTP/1.1 (what the admin API serves).
        config.alpn_protocols = Vec::new();
        Ok(config)
    }

    fn files(&self) -> Vec<&Path> {
        let mut files = vec![self.cert_file.as_path(), self.key_file.as_path()];
        if !self.trust_certs_file.as_os_str().is_empty() {
            files.push(self.trust_certs_file.as_path());
        }
        files
    }
}

fn read_file(path: &Path, what: &'static str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|cause| TlsError::Read { what, path: path.to_path_buf(), cause })
}

fn read_certs(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read_file(path, what)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::BadPem { what, path: path.to_path_buf(), cause: e.to_string() })?;
    if certs.is_empty() {
        return Err(TlsError::Empty { what, path: path.to_path_buf(), expected: "CERTIFICATE" });
    }
    for cert in &certs {
        if let Err(e) = x509_parser::parse_x509_certificate(cert) {
            return Err(TlsError::BadPem { what, path: path.to_path_buf(), cause: e.to_string() });
        }
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read_file(path, "key_file")?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => {
            TlsError::Empty { what: "key_file", path: path.to_path_buf(), expected: "PRIVATE KEY" }
        }
        other => TlsError::BadPem {
            what: "key_file",
            path: path.to_path_buf(),
            cause: other.to_string(),
        },
    })
}

/// The files' modification times (None for a file that cannot be looked at).
fn mtimes(files: &[&Path]) -> Vec<Option<SystemTime>> {
    files.iter().map(|f| std::fs::metadata(f).and_then(|m| m.modified()).ok()).collect()
}

/// The server side of TLS for both listeners: the current rustls configuration, rebuilt when
/// the files change (see the module docs).
pub struct ServerTls {
    config: TlsConfig,
    refresh: Duration,
    state: Mutex<ReloadState>,
}

struct ReloadState {
    current: Arc<ServerConfig>,
    mtimes: Vec<Option<SystemTime>>,
    checked: Instant,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").field("config", &self.config).finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Loads the files of an enabled `[tls]` section (errors name the file at fault).
    pub fn load(config: &TlsConfig) -> Result<ServerTls, TlsError> {
        let mtimes = mtimes(&config.files());
        let current = Arc::new(config.server_config()?);
        Ok(ServerTls {
            config: config.clone(),
            refresh: Duration::from_secs(config.cert_refresh_check_seconds),
            state: Mutex::new(ReloadState { current, mtimes, checked: Instant::now() }),
        })
    }

    /// The configuration for a new connection, reloaded first if the files changed (looked at
    /// most every `cert_refresh_check_seconds`). Blocks briefly when it reloads (reads three
    /// small files): call it from the connection's task.
    pub fn current(&self) -> Arc<ServerConfig> {
        // Poisoned only by a panic while reloading: the state is still whole, go on with it.
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.checked.elapsed() < self.refresh {
            return state.current.clone();
        }
        state.checked = Instant::now();
        let now = mtimes(&self.config.files());
        if now != state.mtimes {
            match self.config.server_config() {
                Ok(config) => {
                    tracing::info!(cert = %self.config.cert_file.display(), "TLS certificates reloaded");
                    state.current = Arc::new(config);
                    state.mtimes = now;
                }
                Err(error) => {
                    // Half-written files: tried again at the next look, as the mtimes differ.
                    tracing::warn!(%error, "TLS files changed but do not load; keeping the previous certificates");
                }
            }
        }
        state.current.clone()
    }

    /// An acceptor with the current configuration (see [`ServerTls::current`]).
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.current())
    }

    /// The section it was loaded from.
    pub fn config(&self) -> &TlsConfig {
        &self.config
    }
}

/// A rustls client configuration for our own TLS servers other than the broker (a storage
/// node): servers verified against the PEM CAs of `trust_certs_file`, and, with `client_cert`
/// (a PEM chain and its key), that certificate presented to servers that ask (mTLS).
pub fn client_config(
    trust_certs_file: &Path,
    client_cert: Option<(&Path, &Path)>,
) -> Result<rustls::ClientConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for cert in read_certs(trust_certs_file, "trust_certs_file")? {
        roots.add(cert).map_err(|e| TlsError::BadTrust {
            path: trust_certs_file.to_path_buf(),
            cause: e.to_string(),
        })?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Rustls(e.to_string()))?
        .with_root_certificates(roots);
    match client_cert {
        None => Ok(builder.with_no_client_auth()),
        Some((cert_file, key_file)) => {
            let chain = read_certs(cert_file, "cert_file")?;
            let key = read_key(key_file)?;
            builder.with_client_auth_cert(chain, key).map_err(|e| TlsError::KeyMismatch {
                cert: cert_file.to_path_buf(),
                key: key_file.to_path_buf(),
                cause: e.to_string(),
            })
        }
    }
}

/// What a finished handshake tells about the peer: TLS, and the subject CN of its certificate
/// (verified by the trust store, as rustls only keeps a certificate it verified).
pub fn transport_identity(connection: &ServerConnection) -> TransportIdentity {
    let common_name = connection
        .peer_certificates()
        .and_then(|chain| chain.first())
        .and_then(|cert| subject_common_name(cert));
    TransportIdentity { tls: true, client_cert_common_name: common_name }
}

/// The first subject CN of a DER certificate (None when it has none or does not parse).
pub fn subject_common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_string)
}

/// Accepts a TLS connection on `socket` within [`HANDSHAKE_TIMEOUT`] and returns it with the
/// peer's identity; None when the handshake failed or took too long, logged at WARN with the
/// peer and the reason (at most a line a second: a scan or a flood of plain-text clients must
/// not fill the log), so an operator sees why a client cannot connect.
pub async fn accept<S>(
    tls: &ServerTls,
    socket: S,
    peer: &str,
) -> Option<(tokio_rustls::server::TlsStream<S>, TransportIdentity)>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    accept_within(tls, socket, peer, HANDSHAKE_TIMEOUT).await
}

async fn accept_within<S>(
    tls: &ServerTls,
    socket: S,
    peer: &str,
    limit: Duration,
) -> Option<(tokio_rustls::server::TlsStream<S>, TransportIdentity)>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    match tokio::time::timeout(limit, tls.acceptor().accept(socket)).await {
        Ok(Ok(stream)) => {
            let identity = transport_identity(stream.get_ref().1);
            Some((stream, identity))
        }
        Ok(Err(error)) => {
            magnetar_clock::warn_limited!(
                magnetar_clock::log_limit::system_ms(),
                %peer,
                %error,
                "TLS handshake failed"
            );
            None
        }
        Err(_) => {
            magnetar_clock::warn_limited!(
                magnetar_clock::log_limit::system_ms(),
                %peer,
                error = "no handshake within the time limit",
                "TLS handshake failed"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::ServerName;
    use std::io::Write;

    use magnetar_test_support::tls::TestCa as Ca;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        let mut file = std::fs::File::create(&path).expect("create");
        file.write_all(text.as_bytes()).expect("write");
        path
    }

    /// An enabled section with a server certificate for localhost signed by `ca`.
    fn config(dir: &Path, ca: &Ca) -> TlsConfig {
        let (cert, key) = ca.leaf("server");
        TlsConfig {
            enabled: true,
            cert_file: write(dir, "server.pem", &cert),
            key_file: write(dir, "server.key", &key),
            ..TlsConfig::default()
        }
    }

    fn client_config(ca: &Ca, client: Option<(String, String)>) -> Arc<rustls::ClientConfig> {
        let mut roots = RootCertStore::empty();
        roots.add(ca.cert.der().clone()).expect("root");
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots);
        let config = match client {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .expect("chain");
                let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key");
                builder.with_client_auth_cert(chain, key).expect("client cert")
            }
        };
        Arc::new(config)
    }

    /// Handshakes a client against `server`: the server's view of the peer, or None when refused;
    /// and the certificate the server presented (when the client got that far).
    async fn handshake(
        server: &ServerTls,
        client: Arc<rustls::ClientConfig>,
    ) -> (Option<TransportIdentity>, Option<Vec<u8>>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (a, b) = tokio::io::duplex(64 << 10);
        let connector = tokio_rustls::TlsConnector::from(client);
        let name = ServerName::try_from("localhost").expect("name");
        let client_side = async move {
            let mut stream = connector.connect(name, b).await.ok()?;
            let cert = stream.get_ref().1.peer_certificates()?.first()?.to_vec();
            // TLS 1.3: a refused client certificate shows on the first read.
            stream.write_all(b"ping").await.ok()?;
            let mut buf = [0u8; 4];
            stream.read_exact(&mut buf).await.ok()?;
            Some(cert)
        };
        let server_side = async move {
            let (mut stream, identity) = accept(server, a, "test").await?;
            let mut buf = [0u8; 4];
            stream.read_exact(&mut buf).await.ok()?;
            stream.write_all(b"pong").await.ok()?;
            stream.flush().await.ok()?;
            Some(identity)
        };
        tokio::join!(server_side, client_side)
    }

    #[test]
    fn validation_names_the_fault() {
        let disabled = TlsConfig::default();
        assert!(disabled.validate(6650, 8080).is_ok());
        let no_listener = TlsConfig { plain_ports_enabled: false, ..TlsConfig::default() };
        assert!(matches!(no_listener.validate(6650, 8080), Err(TlsError::NoListener)));
        let enabled = TlsConfig {
            enabled: true,
            cert_file: "c.pem".into(),
            key_file: "k.pem".into(),
            ..TlsConfig::default()
        };
        assert!(enabled.validate(6650, 8080).is_ok());
        let missing = TlsConfig { key_file: PathBuf::new(), ..enabled.clone() };
        assert!(matches!(missing.validate(6650, 8080), Err(TlsError::Missing { key: "key_file" })));
        let clash = TlsConfig { broker_port_tls: 8080, ..enabled.clone() };
        let error = clash.validate(6650, 8080).expect_err("clash");
        assert!(error.to_string().contains("broker_port_tls and web_port"), "{error}");
        // The plain ports do not count once they are off; port 0 never clashes.
        let off =
            TlsConfig { broker_port_tls: 8080, plain_ports_enabled: false, ..enabled.clone() };
        assert!(off.validate(6650, 8080).is_ok());
        let any = TlsConfig { broker_port_tls: 0, web_port_tls: 0, ..enabled.clone() };
        assert!(any.validate(0, 0).is_ok());
        let bad_version = TlsConfig { protocols: vec!["SSLv3".into()], ..enabled.clone() };
        assert!(
            matches!(bad_version.validate(6650, 8080), Err(TlsError::UnknownProtocol(p)) if p == "SSLv3")
        );
        let none = TlsConfig { protocols: vec![], ..enabled.clone() };
        assert!(matches!(none.validate(6650, 8080), Err(TlsError::NoProtocols)));
        let require = TlsConfig { require_trusted_client_cert: true, ..enabled };
        assert!(matches!(require.validate(6650, 8080), Err(TlsError::RequireWithoutTrust)));
    }

    #[test]
    fn toml_section_defaults_and_unknown_keys() {
        let config: TlsConfig = toml::from_str("enabled = true\ncert_file = \"a\"").expect("parse");
        assert!(config.enabled);
        assert_eq!(config.broker_port_tls, 6651);
        assert_eq!(config.web_port_tls, 8443);
        assert_eq!(config.cert_refresh_check_seconds, 300);
        assert_eq!(config.protocols, vec!["TLSv1.3", "TLSv1.2"]);
        assert!(config.plain_ports_enabled);
        assert!(toml::from_str::<TlsConfig>("enable = true").is_err());
    }

    #[test]
    fn bad_files_are_named() {
        let dir = tempfile::tempdir().expect("dir");
        let ca = Ca::new("ca");
        let good = config(dir.path(), &ca);
        assert!(ServerTls::load(&good).is_ok());

        let absent = TlsConfig { cert_file: dir.path().join("nope.pem"), ..good.clone() };
        let error = ServerTls::load(&absent).expect_err("absent");
        assert!(matches!(error, TlsError::Read { what: "cert_file", .. }), "{error}");
        assert!(error.to_string().contains("nope.pem"), "{error}");

        let text =
            TlsConfig { cert_file: write(dir.path(), "text.pem", "hello\n"), ..good.clone() };
        let error = ServerTls::load(&text).expect_err("not pem");
        assert!(matches!(error, TlsError::Empty { what: "cert_file", .. }), "{error}");

        let garbage = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let broken =
            TlsConfig { cert_file: write(dir.path(), "broken.pem", garbage), ..good.clone() };
        let error = ServerTls::load(&broken).expect_err("bad der");
        assert!(matches!(error, TlsError::BadPem { what: "cert_file", .. }), "{error}");

        let no_key = TlsConfig { key_file: good.cert_file.clone(), ..good.clone() };
        let error = ServerTls::load(&no_key).expect_err("no key");
        assert!(matches!(error, TlsError::Empty { what: "key_file", .. }), "{error}");

        let (_, other_key) = ca.leaf("other");
        let mismatch =
            TlsConfig { key_file: write(dir.path(), "other.key", &other_key), ..good.clone() };
        let error = ServerTls::load(&mismatch).expect_err("mismatch");
        assert!(matches!(error, TlsError::KeyMismatch { .. }), "{error}");

        let trust = TlsConfig { trust_certs_file: write(dir.path(), "empty.pem", ""), ..good };
        let error = ServerTls::load(&trust).expect_err("empty trust");
        assert!(matches!(error, TlsError::Empty { what: "trust_certs_file", .. }), "{error}");
    }

    #[tokio::test]
    async fn client_certificates_are_verified_and_named() {
        let dir = tempfile::tempdir().expect("dir");
        let ca = Ca::new("ca");
        let stranger = Ca::new("stranger");
        let mut config = config(dir.path(), &ca);
        config.trust_certs_file = write(dir.path(), "ca.pem", &ca.cert.pem());
        let server = ServerTls::load(&config).expect("load");

        let (identity, _) = handshake(&server, client_config(&ca, Some(ca.leaf("alice")))).await;
        let identity = identity.expect("trusted client admitted");
        assert_eq!(
            identity,
            TransportIdentity { tls: true, client_cert_common_name: Some("alice".into()) }
        );

        let (identity, _) = handshake(&server, client_config(&ca, None)).await;
        assert_eq!(identity, Some(TransportIdentity { tls: true, client_cert_common_name: None }));

        let (identity, _) =
            handshake(&server, client_config(&ca, Some(stranger.leaf("mallory")))).await;
        assert_eq!(identity, None, "untrusted client certificate refused");

        config.require_trusted_client_cert = true;
        let strict = ServerTls::load(&config).expect("load");
        let (identity, _) = handshake(&strict, client_config(&ca, None)).await;
        assert_eq!(identity, None, "no client certificate refused when required");
        let (identity, _) = handshake(&strict, client_config(&ca, Some(ca.leaf("bob")))).await;
        assert_eq!(identity.and_then(|i| i.client_cert_common_name).as_deref(), Some("bob"));
    }

    #[tokio::test]
    async fn handshake_that_never_finishes_times_out() {
        let dir = tempfile::tempdir().expect("dir");
        let server = ServerTls::load(&config(dir.path(), &Ca::new("ca"))).expect("load");
        // (A shorter limit than HANDSHAKE_TIMEOUT, in real time: tokio's paused clock would
        // need its `test-util` feature, which makes `cargo test --workspace` build tokio, and
        // everything above it, a second time for the shipped binary.)
        let limit = Duration::from_millis(200);
        let (a, _silent_client) = tokio::io::duplex(1024);
        let started = tokio::time::Instant::now();
        assert!(accept_within(&server, a, "test", limit).await.is_none());
        assert!(started.elapsed() >= limit);
    }

    #[tokio::test]
    async fn reload_on_change_and_keep_on_bad_file() {
        let dir = tempfile::tempdir().expect("dir");
        let ca = Ca::new("ca");
        let mut config = config(dir.path(), &ca);
        config.cert_refresh_check_seconds = 0;
        let server = ServerTls::load(&config).expect("load");
        let first = server.current();
        assert!(Arc::ptr_eq(&first, &server.current()), "unchanged files: same configuration");
        let (_, served) = handshake(&server, client_config(&ca, None)).await;
        let old_der = served.expect("served");

        // New certificate and key: the next connection gets them.
        let (cert, key) = ca.leaf("server-2");
        let later = SystemTime::now() + Duration::from_secs(5);
        for (path, text) in [(&config.cert_file, &cert), (&config.key_file, &key)] {
            std::fs::write(path, text).expect("rewrite");
            std::fs::File::options()
                .write(true)
                .open(path)
                .expect("open")
                .set_modified(later)
                .expect("mtime");
        }
        let (_, served) = handshake(&server, client_config(&ca, None)).await;
        let new_der = served.expect("served");
        assert_ne!(new_der, old_der);
        assert_eq!(subject_common_name(&new_der).as_deref(), Some("server-2"));
        let reloaded = server.current();

        // A broken file keeps the last good configuration.
        std::fs::write(&config.cert_file, "not a certificate").expect("rewrite");
        let even_later = later + Duration::from_secs(5);
        std::fs::File::options()
            .write(true)
            .open(&config.cert_file)
            .expect("open")
            .set_modified(even_later)
            .expect("mtime");
        assert!(Arc::ptr_eq(&reloaded, &server.current()), "bad file: previous configuration kept");
        let (_, served) = handshake(&server, client_config(&ca, None)).await;
        assert_eq!(served.expect("still served"), new_der);
    }

    #[test]
    fn refresh_period_bounds_the_looks() {
        let dir = tempfile::tempdir().expect("dir");
        let ca = Ca::new("ca");
        let config = config(dir.path(), &ca); // 300 s
        let server = ServerTls::load(&config).expect("load");
        let first = server.current();
        let (cert, key) = ca.leaf("server-2");
        std::fs::write(&config.cert_file, cert).expect("rewrite");
        std::fs::write(&config.key_file, key).expect("rewrite");
        assert!(Arc::ptr_eq(&first, &server.current()), "not looked at before the period");
    }
}
