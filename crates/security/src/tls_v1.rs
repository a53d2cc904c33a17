//! Client certificates of X.509 version 1 (no extensions), which older internal CAs still
//! issue and the Python client's test certificates are: webpki accepts only version 3 and
//! refuses them (`UnsupportedCertVersion`), where Pulsar's Java stack takes them. A version 1
//! client certificate is verified here with the same checks (each certificate signed by the
//! next, up to a trusted root; each within its validity at the handshake; intermediates must be
//! CAs) and its handshake signature checked with the provider's algorithms; every other
//! certificate goes to webpki's verifier unchanged.

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, Error, SignatureScheme};
use std::sync::Arc;
use x509_parser::prelude::{FromDer, X509Certificate, X509Version};
use x509_parser::time::ASN1Time;

/// Most certificates between a client certificate and its root.
const MAX_CHAIN: usize = 6;

/// webpki's client verifier, with version 1 client certificates verified here.
#[derive(Debug)]
pub(crate) struct V1TolerantVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    /// The trusted roots (DER), as read from `trust_certs_file`.
    roots: Vec<CertificateDer<'static>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl V1TolerantVerifier {
    pub(crate) fn new(
        inner: Arc<dyn ClientCertVerifier>,
        roots: Vec<CertificateDer<'static>>,
        algorithms: WebPkiSupportedAlgorithms,
    ) -> Self {
        V1TolerantVerifier { inner, roots, algorithms }
    }
}

fn bad(error: CertificateError) -> Error {
    Error::InvalidCertificate(error)
}

fn parse<'a>(der: &'a CertificateDer<'_>) -> Result<X509Certificate<'a>, Error> {
    X509Certificate::from_der(der.as_ref())
        .map(|(_, cert)| cert)
        .map_err(|_| bad(CertificateError::BadEncoding))
}

/// Whether `der` is a version 1 certificate (webpki refuses those).
fn is_v1(der: &CertificateDer<'_>) -> bool {
    parse(der).is_ok_and(|cert| cert.version() == X509Version::V1)
}

/// Verifies `leaf` up to one of `roots` through `intermediates` at `now`.
pub(crate) fn verify_chain(
    leaf: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
    roots: &[CertificateDer<'_>],
    now: UnixTime,
) -> Result<(), Error> {
    let at = i64::try_from(now.as_secs())
        .ok()
        .and_then(|secs| ASN1Time::from_timestamp(secs).ok())
        .ok_or_else(|| bad(CertificateError::BadEncoding))?;
    let roots: Vec<X509Certificate<'_>> = roots.iter().filter_map(|r| parse(r).ok()).collect();
    let intermediates: Vec<X509Certificate<'_>> =
        intermediates.iter().filter_map(|c| parse(c).ok()).collect();
    let mut current = parse(leaf)?;
    for _ in 0..MAX_CHAIN {
        if !current.validity().is_valid_at(at) {
            return Err(bad(CertificateError::Expired));
        }
        let issuer = current.issuer().as_raw();
        let signed_by = |candidate: &X509Certificate<'_>| {
            candidate.subject().as_raw() == issuer
                && current.verify_signature(Some(candidate.public_key())).is_ok()
        };
        if let Some(root) = roots.iter().find(|root| signed_by(root)) {
            return if root.validity().is_valid_at(at) {
                Ok(())
            } else {
                Err(bad(CertificateError::Expired))
            };
        }
        let Some(next) = intermediates.iter().find(|c| signed_by(c) && c.is_ca()) else {
            return Err(bad(CertificateError::UnknownIssuer));
        };
        current = next.clone();
    }
    Err(bad(CertificateError::UnknownIssuer))
}

/// The handshake signature `dss` over `message` by `cert`'s key, with the algorithms the
/// scheme maps to (TLS 1.2 may map one scheme to several).
fn verify_signature(
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
    algorithms: &WebPkiSupportedAlgorithms,
) -> Result<HandshakeSignatureValid, Error> {
    let parsed = parse(cert)?;
    let candidates = algorithms.mapping.iter().find(|(scheme, _)| *scheme == dss.scheme);
    let Some((_, candidates)) = candidates else {
        return Err(Error::PeerMisbehaved(
            rustls::PeerMisbehaved::SignedHandshakeWithUnadvertisedSigScheme,
        ));
    };
    let key = parsed.public_key().subject_public_key.data.as_ref();
    for algorithm in candidates.iter() {
        if algorithm.verify_signature(key, message, dss.signature()).is_ok() {
            return Ok(HandshakeSignatureValid::assertion());
        }
    }
    Err(bad(CertificateError::BadSignature))
}

/// The schemes TLS 1.3 allows (RFC 8446 4.2.3; rustls keeps its own list private).
fn supported_in_tls13(scheme: SignatureScheme) -> bool {
    use SignatureScheme as S;
    matches!(
        scheme,
        S::ECDSA_NISTP521_SHA512
            | S::ECDSA_NISTP384_SHA384
            | S::ECDSA_NISTP256_SHA256
            | S::RSA_PSS_SHA512
            | S::RSA_PSS_SHA384
            | S::RSA_PSS_SHA256
            | S::ED25519
    )
}

impl ClientCertVerifier for V1TolerantVerifier {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        if !is_v1(end_entity) {
            return self.inner.verify_client_cert(end_entity, intermediates, now);
        }
        verify_chain(end_entity, intermediates, &self.roots, now)?;
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        if !is_v1(cert) {
            return self.inner.verify_tls12_signature(message, cert, dss);
        }
        verify_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        if !is_v1(cert) {
            return self.inner.verify_tls13_signature(message, cert, dss);
        }
        if !supported_in_tls13(dss.scheme) {
            return Err(Error::PeerMisbehaved(
                rustls::PeerMisbehaved::SignedHandshakeWithUnadvertisedSigScheme,
            ));
        }
        verify_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    // Certificates only (no keys), made once with the openssl CLI for a century: a v3 CA and
    // the v1 client certificate "bob" signed by it, and bob signed by another CA.
    const CA: &str = include_str!("../tests/fixtures/v1/ca.pem");
    const BOB: &str = include_str!("../tests/fixtures/v1/bob-v1.pem");
    const BOB_BY_OTHER: &str = include_str!("../tests/fixtures/v1/bob-by-other-v1.pem");

    fn der(pem: &str) -> CertificateDer<'static> {
        let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        CertificateDer::from(pem.contents)
    }

    fn at(secs: u64) -> UnixTime {
        UnixTime::since_unix_epoch(Duration::from_secs(secs))
    }

    #[test]
    fn a_version_1_leaf_chains_to_its_own_root_only_and_within_its_validity() {
        let (ca, bob, stranger) = (der(CA), der(BOB), der(BOB_BY_OTHER));
        assert!(is_v1(&bob) && !is_v1(&ca));
        let in_2031 = at(1_924_000_000);
        assert_eq!(verify_chain(&bob, &[], std::slice::from_ref(&ca), in_2031), Ok(()));
        assert_eq!(
            verify_chain(&stranger, &[], std::slice::from_ref(&ca), in_2031),
            Err(bad(CertificateError::UnknownIssuer))
        );
        // A certificate sent as an intermediate that is no CA does not make a chain.
        assert_eq!(
            verify_chain(&stranger, std::slice::from_ref(&bob), std::slice::from_ref(&ca), in_2031),
            Err(bad(CertificateError::UnknownIssuer))
        );
        let in_2001 = at(1_000_000_000);
        assert_eq!(
            verify_chain(&bob, &[], std::slice::from_ref(&ca), in_2001),
            Err(bad(CertificateError::Expired))
        );
        assert_eq!(
            verify_chain(&CertificateDer::from(vec![0x30, 0x03]), &[], &[ca], in_2031),
            Err(bad(CertificateError::BadEncoding))
        );
    }
}
