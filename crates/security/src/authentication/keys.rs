//! Keys in Pulsar's forms: where they are (`file:///path`, `data:;base64,...`, a plain path or
//! base64 text, as Pulsar's `AuthTokenUtils.readKeyFromUrl`) and how they are encoded (secret
//! keys are raw bytes; public keys X.509 SubjectPublicKeyInfo in DER, as Java's
//! `PublicKey.getEncoded()`, or PEM; private keys PKCS#8 DER or PEM).

use super::der;
use base64::Engine;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey};

/// A key that cannot be read or parsed. Never carries key bytes.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read key file {path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("data: URL is not `data:[<type>];base64,<data>`")]
    DataUrl,
    #[error("key is neither an existing file nor base64 text")]
    NotBase64,
    #[error("key is empty")]
    Empty,
    #[error("not a PEM document")]
    Pem,
    #[error("not an X.509 SubjectPublicKeyInfo (DER or PEM)")]
    PublicKey,
    #[error("not a PKCS#8 private key (DER or PEM)")]
    PrivateKey,
    #[error("the key is {found}, the algorithm {algorithm:?} needs {needed}")]
    Family { found: &'static str, needed: &'static str, algorithm: Algorithm },
}

/// Reads a key's bytes from Pulsar's forms.
pub fn read_key(location: &str) -> Result<Vec<u8>, KeyError> {
    let location = location.trim();
    let bytes = if let Some(rest) = location.strip_prefix("data:") {
        let (header, data) = rest.split_once(',').ok_or(KeyError::DataUrl)?;
        if header.ends_with(";base64") {
            base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .map_err(|_| KeyError::DataUrl)?
        } else {
            data.as_bytes().to_vec()
        }
    } else if let Some(rest) = location.strip_prefix("file:") {
        // file:///path, file:/path
        let path = rest.strip_prefix("//").unwrap_or(rest);
        std::fs::read(path).map_err(|error| KeyError::Read { path: path.to_string(), error })?
    } else if std::path::Path::new(location).is_file() {
        std::fs::read(location)
            .map_err(|error| KeyError::Read { path: location.to_string(), error })?
    } else {
        base64::engine::general_purpose::STANDARD
            .decode(location)
            .map_err(|_| KeyError::NotBase64)?
    };
    if bytes.is_empty() {
        return Err(KeyError::Empty);
    }
    Ok(bytes)
}

/// The DER inside a PEM document (first block), or the bytes themselves when they are not PEM.
fn pem_or_der(bytes: &[u8]) -> Result<(Option<String>, Vec<u8>), KeyError> {
    let Ok(text) = std::str::from_utf8(bytes) else { return Ok((None, bytes.to_vec())) };
    let Some(start) = text.find("-----BEGIN ") else { return Ok((None, bytes.to_vec())) };
    let after = &text[start + 11..];
    let label_end = after.find("-----").ok_or(KeyError::Pem)?;
    let label = after[..label_end].to_string();
    let body = &after[label_end + 5..];
    let end = body.find("-----END").ok_or(KeyError::Pem)?;
    let b64: String = body[..end].chars().filter(|c| !c.is_whitespace()).collect();
    let der = base64::engine::general_purpose::STANDARD.decode(b64).map_err(|_| KeyError::Pem)?;
    Ok((Some(label), der))
}

/// The key family an algorithm needs.
pub fn family(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => "a secret key",
        Algorithm::ES256 | Algorithm::ES384 => "an EC key",
        Algorithm::EdDSA => "an Ed25519 key",
        _ => "an RSA key",
    }
}

/// A public key (SubjectPublicKeyInfo DER or PEM, or PKCS#1 `RSA PUBLIC KEY` PEM) for
/// verifying tokens of `algorithm`'s family.
pub fn decoding_key(bytes: &[u8], algorithm: Algorithm) -> Result<DecodingKey, KeyError> {
    let (label, der) = pem_or_der(bytes)?;
    let (is_rsa, key) = if label.as_deref() == Some("RSA PUBLIC KEY") {
        (true, der.clone())
    } else {
        let (oid, key) = der::parse_spki(&der).ok_or(KeyError::PublicKey)?;
        if oid == der::OID_RSA {
            (true, key.to_vec())
        } else if oid == der::OID_EC {
            (false, key.to_vec())
        } else {
            return Err(KeyError::PublicKey);
        }
    };
    let needed = family(algorithm);
    let found = if is_rsa { "an RSA key" } else { "an EC key" };
    if found != needed {
        return Err(KeyError::Family { found, needed, algorithm });
    }
    Ok(if is_rsa { DecodingKey::from_rsa_der(&key) } else { DecodingKey::from_ec_der(&key) })
}

/// A private key (PKCS#8 DER or PEM; PKCS#1 `RSA PRIVATE KEY` PEM) for signing tokens.
/// Returns the key and whether it is RSA (else EC).
pub fn encoding_key(bytes: &[u8]) -> Result<(EncodingKey, bool), KeyError> {
    let (label, der) = pem_or_der(bytes)?;
    if label.as_deref() == Some("RSA PRIVATE KEY") {
        return Ok((EncodingKey::from_rsa_der(&der), true));
    }
    let (oid, key) = der::parse_pkcs8(&der).ok_or(KeyError::PrivateKey)?;
    if oid == der::OID_RSA {
        Ok((EncodingKey::from_rsa_der(key), true))
    } else if oid == der::OID_EC {
        // ring signs ECDSA from the whole PKCS#8 document.
        Ok((EncodingKey::from_ec_der(&der), false))
    } else {
        Err(KeyError::PrivateKey)
    }
}

/// The public half of a PKCS#8 private key as SubjectPublicKeyInfo DER (what `pulsar tokens`
/// writes as the public key file).
pub fn public_key_of(private_pkcs8: &[u8]) -> Result<Vec<u8>, KeyError> {
    use ring::signature::KeyPair;
    let (oid, key) = der::parse_pkcs8(private_pkcs8).ok_or(KeyError::PrivateKey)?;
    if oid == der::OID_RSA {
        let pair = ring::signature::RsaKeyPair::from_der(key).map_err(|_| KeyError::PrivateKey)?;
        let mut algorithm = der::tlv(0x06, der::OID_RSA);
        algorithm.extend_from_slice(&[0x05, 0x00]);
        Ok(der::spki(&algorithm, pair.public_key().as_ref()))
    } else if oid == der::OID_EC {
        let rng = ring::rand::SystemRandom::new();
        let pair = ring::signature::EcdsaKeyPair::from_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            private_pkcs8,
            &rng,
        )
        .map_err(|_| KeyError::PrivateKey)?;
        let mut algorithm = der::tlv(0x06, der::OID_EC);
        // prime256v1
        algorithm.extend(der::tlv(0x06, &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07]));
        Ok(der::spki(&algorithm, pair.public_key().as_ref()))
    } else {
        Err(KeyError::PrivateKey)
    }
}

/// A new HMAC secret key of `bytes` random bytes (what `pulsar tokens create-secret-key`
/// makes: 32 bytes for HS256, raw).
pub fn generate_secret(bytes: usize) -> Vec<u8> {
    use rand::RngCore;
    let mut key = vec![0u8; bytes];
    rand::rngs::OsRng.fill_bytes(&mut key);
    key
}

/// A new key pair as (PKCS#8 DER private key, SubjectPublicKeyInfo DER public key), the files
/// `pulsar tokens create-key-pair` writes: RSA 2048 for the RS/PS algorithms, P-256 for ES256.
pub fn generate_key_pair(algorithm: Algorithm) -> Result<(Vec<u8>, Vec<u8>), KeyError> {
    match algorithm {
        Algorithm::ES256 => {
            let rng = ring::rand::SystemRandom::new();
            let document = ring::signature::EcdsaKeyPair::generate_pkcs8(
                &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
                &rng,
            )
            .map_err(|_| KeyError::PrivateKey)?;
            let private = document.as_ref().to_vec();
            let public = public_key_of(&private)?;
            Ok((private, public))
        }
        Algorithm::RS256
        | Algorithm::RS384
        | Algorithm::RS512
        | Algorithm::PS256
        | Algorithm::PS384
        | Algorithm::PS512 => {
            use rsa::pkcs8::{EncodePrivateKey, EncodePublicKey};
            let key = rsa::RsaPrivateKey::new(&mut rand::rngs::OsRng, 2048)
                .map_err(|_| KeyError::PrivateKey)?;
            let private = key.to_pkcs8_der().map_err(|_| KeyError::PrivateKey)?.as_bytes().to_vec();
            let public = key
                .to_public_key()
                .to_public_key_der()
                .map_err(|_| KeyError::PublicKey)?
                .as_bytes()
                .to_vec();
            Ok((private, public))
        }
        other => {
            Err(KeyError::Family { found: "no key pair", needed: family(other), algorithm: other })
        }
    }
}

/// The algorithm a secret key signs with when none is asked: the strongest its length allows
/// (as jjwt's `signWith(key)` picks for `pulsar tokens create`).
pub fn secret_algorithm(key: &[u8]) -> Algorithm {
    match key.len() {
        64.. => Algorithm::HS512,
        48.. => Algorithm::HS384,
        _ => Algorithm::HS256,
    }
}

/// Signs `claims` with a secret key (raw bytes) or a private key (PKCS#8 DER/PEM), with
/// `algorithm` or the key's default (HS by length, RS256, ES256), adding `headers`.
pub fn sign_token(
    key: &[u8],
    secret: bool,
    algorithm: Option<Algorithm>,
    headers: &[(String, String)],
    claims: &serde_json::Value,
) -> Result<String, KeyError> {
    let (encoding, algorithm) = if secret {
        let algorithm = algorithm.unwrap_or_else(|| secret_algorithm(key));
        if family(algorithm) != "a secret key" {
            return Err(KeyError::Family {
                found: "a secret key",
                needed: family(algorithm),
                algorithm,
            });
        }
        (EncodingKey::from_secret(key), algorithm)
    } else {
        let (encoding, rsa) = encoding_key(key)?;
        let found = if rsa { "an RSA key" } else { "an EC key" };
        let algorithm = algorithm.unwrap_or(if rsa { Algorithm::RS256 } else { Algorithm::ES256 });
        if family(algorithm) != found {
            return Err(KeyError::Family { found, needed: family(algorithm), algorithm });
        }
        (encoding, algorithm)
    };
    // The header as JSON (custom fields allowed), then signed the way jsonwebtoken signs.
    let mut header = serde_json::Map::new();
    header.insert("alg".into(), serde_json::Value::String(format!("{algorithm:?}")));
    for (name, value) in headers {
        header.insert(name.clone(), serde_json::Value::String(value.clone()));
    }
    let b64 = |value: &serde_json::Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(value.to_string().as_bytes())
    };
    let message = format!("{}.{}", b64(&serde_json::Value::Object(header)), b64(claims));
    let signature = jsonwebtoken::crypto::sign(message.as_bytes(), &encoding, algorithm)
        .map_err(|_| KeyError::PrivateKey)?;
    Ok(format!("{message}.{signature}"))
}
