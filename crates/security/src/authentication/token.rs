//! The `token` provider: JWTs as Pulsar's `AuthenticationProviderToken` validates them.

use super::{keys, AuthError, AuthenticationConfig, ConfigError};
use crate::Principal;
use base64::Engine;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};
use std::str::FromStr;

/// The key tokens are verified with, and the algorithms it may verify.
pub struct TokenProvider {
    key: DecodingKey,
    algorithms: Vec<Algorithm>,
    /// Secret key length in bits (HMAC needs at least the hash's size, as jjwt checks).
    secret_bits: Option<usize>,
    role_claim: String,
    audience_claim: String,
    audience: Option<String>,
}

/// Parses an algorithm name (`RS256`, ...), as `token_public_alg` or a token header spells it.
pub fn parse_algorithm(name: &str) -> Option<Algorithm> {
    Algorithm::from_str(name).ok()
}

fn hmac_bits(algorithm: Algorithm) -> usize {
    match algorithm {
        Algorithm::HS384 => 384,
        Algorithm::HS512 => 512,
        _ => 256,
    }
}

impl TokenProvider {
    pub fn from_config(config: &AuthenticationConfig) -> Result<TokenProvider, ConfigError> {
        let secret = !config.token_secret_key.trim().is_empty();
        let public = !config.token_public_key.trim().is_empty();
        let (key, algorithms, secret_bits) = match (secret, public) {
            (true, true) => return Err(ConfigError::TwoTokenKeys),
            (false, false) => return Err(ConfigError::NoTokenKey),
            (true, false) => {
                let bytes = keys::read_key(&config.token_secret_key)
                    .map_err(|error| ConfigError::Key { setting: "token_secret_key", error })?;
                let bits = bytes.len() * 8;
                let algorithms = [Algorithm::HS256, Algorithm::HS384, Algorithm::HS512]
                    .into_iter()
                    .filter(|&a| hmac_bits(a) <= bits)
                    .collect::<Vec<_>>();
                if algorithms.is_empty() {
                    return Err(ConfigError::Key {
                        setting: "token_secret_key",
                        error: keys::KeyError::Empty,
                    });
                }
                (DecodingKey::from_secret(&bytes), algorithms, Some(bits))
            }
            (false, true) => {
                let algorithm = parse_algorithm(&config.token_public_alg)
                    .filter(|a| {
                        !matches!(a, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512)
                    })
                    .ok_or_else(|| ConfigError::PublicAlg(config.token_public_alg.clone()))?;
                let bytes = keys::read_key(&config.token_public_key)
                    .map_err(|error| ConfigError::Key { setting: "token_public_key", error })?;
                let key = keys::decoding_key(&bytes, algorithm)
                    .map_err(|error| ConfigError::Key { setting: "token_public_key", error })?;
                let algorithms = match algorithm {
                    Algorithm::ES256 | Algorithm::ES384 => vec![Algorithm::ES256, Algorithm::ES384],
                    Algorithm::EdDSA => vec![Algorithm::EdDSA],
                    _ => vec![
                        Algorithm::RS256,
                        Algorithm::RS384,
                        Algorithm::RS512,
                        Algorithm::PS256,
                        Algorithm::PS384,
                        Algorithm::PS512,
                    ],
                };
                (key, algorithms, None)
            }
        };
        Ok(TokenProvider {
            key,
            algorithms,
            secret_bits,
            role_claim: config.token_auth_claim.clone(),
            audience_claim: config.token_audience_claim.clone(),
            audience: (!config.token_audience.is_empty()).then(|| config.token_audience.clone()),
        })
    }

    /// Validates a compact JWT at `now_ms` (Unix milliseconds).
    pub fn authenticate(&self, token: &str, now_ms: u64) -> Result<Principal, AuthError> {
        if token.is_empty() {
            return Err(AuthError::Malformed("empty token".into()));
        }
        let mut parts = token.split('.');
        let (Some(header), Some(_), Some(_), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(AuthError::Malformed("a token has three dot-separated parts".into()));
        };
        let header = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(header.trim_end_matches('='))
            .map_err(|_| AuthError::Malformed("token header is not base64url".into()))?;
        let header: Map<String, Value> = serde_json::from_slice(&header)
            .map_err(|_| AuthError::Malformed("token header is not a JSON object".into()))?;
        let alg = header
            .get("alg")
            .and_then(Value::as_str)
            .ok_or_else(|| AuthError::Malformed("token header has no alg".into()))?;
        let algorithm = parse_algorithm(alg)
            .filter(|a| self.algorithms.contains(a))
            .ok_or_else(|| AuthError::Algorithm(alg.chars().take(16).collect()))?;
        if let Some(bits) = self.secret_bits {
            if hmac_bits(algorithm) > bits {
                return Err(AuthError::Algorithm(alg.to_string()));
            }
        }
        let mut validation = Validation::new(algorithm);
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.validate_aud = false;
        validation.required_spec_claims.clear();
        validation.leeway = 0;
        let data = jsonwebtoken::decode::<Map<String, Value>>(token, &self.key, &validation)
            .map_err(|error| {
                use jsonwebtoken::errors::ErrorKind;
                match error.kind() {
                    ErrorKind::InvalidSignature => AuthError::BadSignature,
                    ErrorKind::InvalidAlgorithm => AuthError::Algorithm(alg.to_string()),
                    ErrorKind::InvalidEcdsaKey | ErrorKind::InvalidRsaKey(_) => {
                        AuthError::BadSignature
                    }
                    ErrorKind::Base64(_) => AuthError::Malformed("token is not base64url".into()),
                    ErrorKind::Json(_) | ErrorKind::Utf8(_) => {
                        AuthError::Malformed("token claims are not a JSON object".into())
                    }
                    _ => AuthError::Malformed("token not decodable".into()),
                }
            })?;
        let claims = data.claims;
        let time = |name: &str| -> Result<Option<u64>, AuthError> {
            match claims.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(value) => value
                    .as_f64()
                    .filter(|s| s.is_finite() && *s >= 0.0)
                    .map(|s| Some((s * 1000.0) as u64))
                    .ok_or_else(|| AuthError::Malformed(format!("claim {name} is not a number"))),
            }
        };
        let expires_at_ms = time("exp")?;
        if let Some(exp) = expires_at_ms {
            if now_ms > exp {
                return Err(AuthError::Expired);
            }
        }
        if let Some(nbf) = time("nbf")? {
            if now_ms < nbf {
                return Err(AuthError::NotYetValid);
            }
        }
        if let Some(audience) = &self.audience {
            let ok = match claims.get(&self.audience_claim) {
                Some(Value::String(a)) => a == audience,
                Some(Value::Array(list)) => list.iter().any(|a| a.as_str() == Some(audience)),
                _ => false,
            };
            if !ok {
                return Err(AuthError::Audience);
            }
        }
        let role = match claims.get(&self.role_claim) {
            Some(Value::String(role)) => Some(role.clone()),
            Some(Value::Array(list)) => list.first().and_then(Value::as_str).map(str::to_string),
            _ => None,
        };
        let role = role
            .filter(|r| !r.is_empty())
            .ok_or_else(|| AuthError::NoRole(self.role_claim.clone()))?;
        Ok(Principal { role, method: "token".into(), expires_at_ms })
    }
}
