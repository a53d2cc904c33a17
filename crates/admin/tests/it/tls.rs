//! `serve_tls`: HTTPS with mTLS hands each request the connection's `TransportIdentity` (the
//! client certificate's CN), `serve` hands plain requests the default one; a client that stalls
//! in the handshake does not hold up others; shutdown is graceful.

use std::sync::Arc;

use axum::routing::get;
use axum::Extension;
use magnetar_security::tls::{ServerTls, TlsConfig};
use magnetar_security::TransportIdentity;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use magnetar_test_support::tls::TestCa as Ca;

fn router() -> axum::Router {
    axum::Router::new().route(
        "/whoami",
        get(|Extension(identity): Extension<TransportIdentity>| async move {
            format!(
                "tls={} cn={}",
                identity.tls,
                identity.client_cert_common_name.unwrap_or_default()
            )
        }),
    )
}

async fn https_get(
    port: u16,
    ca: &Ca,
    client: Option<&(String, String)>,
) -> std::io::Result<String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.cert.der().clone()).unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert.as_bytes()).collect::<Result<_, _>>().unwrap(),
                PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap(),
    };
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let mut tls = connector.connect(ServerName::try_from("localhost").unwrap(), tcp).await?;
    tls.write_all(b"GET /whoami HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await?;
    let mut response = String::new();
    tls.read_to_string(&mut response).await?;
    Ok(response)
}

#[tokio::test]
async fn https_requests_carry_the_client_certificate_cn() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test-ca");
    let (cert, key) = ca.leaf("server");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let config = TlsConfig {
        enabled: true,
        cert_file: write("server.pem", &cert),
        key_file: write("server.key", &key),
        trust_certs_file: write("ca.pem", &ca.cert.pem()),
        ..TlsConfig::default()
    };
    let tls = Arc::new(ServerTls::load(&config).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(magnetar_admin::serve_tls(listener, router(), tls, async move {
        let _ = stopped.await;
    }));

    // A client that opens a connection and never starts the handshake holds no one up.
    let _stalled = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();

    let alice = ca.leaf("alice");
    let response = https_get(port, &ca, Some(&alice)).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.ends_with("tls=true cn=alice"), "{response}");

    let response = https_get(port, &ca, None).await.unwrap();
    assert!(response.ends_with("tls=true cn="), "no client certificate: {response}");

    let _ = stop.send(());
    // The loop ends once open requests are done; the stalled handshake is not waited for
    // (its timeout is 10 s).
    tokio::time::timeout(std::time::Duration::from_secs(5), server)
        .await
        .expect("serve_tls stopped")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn plain_requests_carry_the_default_identity() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(magnetar_admin::serve(listener, router(), async move {
        let _ = stopped.await;
    }));
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    tcp.write_all(b"GET /whoami HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut response = String::new();
    tcp.read_to_string(&mut response).await.unwrap();
    assert!(response.ends_with("tls=false cn="), "{response}");
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}
