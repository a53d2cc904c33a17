//! Test certificates (rcgen, made in memory): a CA and the certificates it signs.

/// A self-signed test CA.
pub struct TestCa {
    pub cert: rcgen::Certificate,
    pub key: rcgen::KeyPair,
}

impl TestCa {
    /// A CA whose subject CN is `name`.
    pub fn new(name: &str) -> TestCa {
        let key = rcgen::KeyPair::generate().expect("a key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        let cert = params.self_signed(&key).expect("self-signed");
        TestCa { cert, key }
    }

    /// A certificate for subject CN `cn`, valid for localhost and 127.0.0.1, signed by this
    /// CA: (certificate PEM, private key PEM).
    pub fn leaf(&self, cn: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("a key");
        let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        let mut params = rcgen::CertificateParams::new(names).expect("params");
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let cert = params.signed_by(&key, &self.cert, &self.key).expect("signed");
        (cert.pem(), key.serialize_pem())
    }
}
