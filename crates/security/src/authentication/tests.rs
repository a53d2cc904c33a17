use super::*;
use base64::Engine;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::json;

const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";
const RSA_PRIVATE: &[u8] = include_bytes!("../../testdata/rsa_private.der");
const RSA_PUBLIC: &[u8] = include_bytes!("../../testdata/rsa_public.der");
const RSA_PUBLIC_PEM: &[u8] = include_bytes!("../../testdata/rsa_public.pem");
const EC_PRIVATE: &[u8] = include_bytes!("../../testdata/ec_private.der");
const EC_PUBLIC: &[u8] = include_bytes!("../../testdata/ec_public.der");
const NOW_MS: u64 = 1_700_000_000_000;

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn data_url(bytes: &[u8]) -> String {
    format!("data:;base64,{}", b64(bytes))
}

fn secret_config() -> AuthenticationConfig {
    AuthenticationConfig { enabled: true, token_secret_key: data_url(SECRET), ..Default::default() }
}

fn rsa_config() -> AuthenticationConfig {
    AuthenticationConfig {
        enabled: true,
        token_public_key: data_url(RSA_PUBLIC),
        ..Default::default()
    }
}

fn hs(claims: serde_json::Value) -> String {
    encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(SECRET)).unwrap()
}

fn rs(claims: serde_json::Value) -> String {
    let (key, rsa) = keys::encoding_key(RSA_PRIVATE).unwrap();
    assert!(rsa);
    encode(&Header::new(Algorithm::RS256), &claims, &key).unwrap()
}

fn auth(config: &AuthenticationConfig, token: &str) -> Result<Principal, AuthError> {
    let authenticator = Authenticator::from_config(config).unwrap();
    authenticator.authenticate(
        Some("token"),
        token.as_bytes(),
        &TransportIdentity::default(),
        NOW_MS,
    )
}

#[test]
fn hs256_token_gives_its_subject_and_expiry() {
    let token = hs(json!({"sub": "alice", "exp": NOW_MS / 1000 + 60}));
    let principal = auth(&secret_config(), &token).unwrap();
    assert_eq!(principal.role, "alice");
    assert_eq!(principal.method, "token");
    assert_eq!(principal.expires_at_ms, Some(NOW_MS + 60_000));
    let no_exp = hs(json!({"sub": "bob"}));
    assert_eq!(auth(&secret_config(), &no_exp).unwrap().expires_at_ms, None);
}

#[test]
fn expired_token_refused_without_leeway() {
    let token = hs(json!({"sub": "alice", "exp": NOW_MS / 1000 - 1}));
    assert_eq!(auth(&secret_config(), &token), Err(AuthError::Expired));
    let nbf = hs(json!({"sub": "alice", "nbf": NOW_MS / 1000 + 10}));
    assert_eq!(auth(&secret_config(), &nbf), Err(AuthError::NotYetValid));
}

#[test]
fn wrong_key_tampered_and_truncated_tokens_refused() {
    let other = encode(
        &Header::new(Algorithm::HS256),
        &json!({"sub": "alice"}),
        &EncodingKey::from_secret(b"another secret of thirty-two byt"),
    )
    .unwrap();
    assert_eq!(auth(&secret_config(), &other), Err(AuthError::BadSignature));
    let token = hs(json!({"sub": "alice"}));
    let parts: Vec<&str> = token.split('.').collect();
    let forged_claims =
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(br#"{"sub":"admin"}"#);
    let tampered = format!("{}.{}.{}", parts[0], forged_claims, parts[2]);
    assert_eq!(auth(&secret_config(), &tampered), Err(AuthError::BadSignature));
    let truncated = &token[..token.len() - 5];
    assert_eq!(auth(&secret_config(), truncated), Err(AuthError::BadSignature));
    assert!(matches!(auth(&secret_config(), &token[..10]), Err(AuthError::Malformed(_))));
    assert!(matches!(auth(&secret_config(), ""), Err(AuthError::Malformed(_))));
    assert!(matches!(auth(&secret_config(), "a.b.c.d"), Err(AuthError::Malformed(_))));
}

#[test]
fn alg_none_refused() {
    let header = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(br#"{"alg":"none"}"#);
    let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(br#"{"sub":"admin"}"#);
    let token = format!("{header}.{claims}.");
    assert_eq!(auth(&secret_config(), &token), Err(AuthError::Algorithm("none".into())));
    assert_eq!(auth(&rsa_config(), &token), Err(AuthError::Algorithm("none".into())));
}

#[test]
fn rs256_with_der_and_pem_public_keys() {
    let token = rs(json!({"sub": "carol"}));
    assert_eq!(auth(&rsa_config(), &token).unwrap().role, "carol");
    let pem = AuthenticationConfig { token_public_key: data_url(RSA_PUBLIC_PEM), ..rsa_config() };
    assert_eq!(auth(&pem, &token).unwrap().role, "carol");
    // An HS256 token to an RSA-configured broker is refused, even signed with the public key.
    assert!(matches!(auth(&rsa_config(), &hs(json!({"sub": "x"}))), Err(AuthError::Algorithm(_))));
}

#[test]
fn key_confusion_refused() {
    let forged = encode(
        &Header::new(Algorithm::HS256),
        &json!({"sub": "admin"}),
        &EncodingKey::from_secret(RSA_PUBLIC),
    )
    .unwrap();
    assert_eq!(auth(&rsa_config(), &forged), Err(AuthError::Algorithm("HS256".into())));
    let pem_forged = encode(
        &Header::new(Algorithm::HS256),
        &json!({"sub": "admin"}),
        &EncodingKey::from_secret(RSA_PUBLIC_PEM),
    )
    .unwrap();
    assert_eq!(auth(&rsa_config(), &pem_forged), Err(AuthError::Algorithm("HS256".into())));
}

#[test]
fn es256_tokens() {
    let config = AuthenticationConfig {
        token_public_key: data_url(EC_PUBLIC),
        token_public_alg: "ES256".into(),
        ..rsa_config()
    };
    let (key, rsa) = keys::encoding_key(EC_PRIVATE).unwrap();
    assert!(!rsa);
    let token = encode(&Header::new(Algorithm::ES256), &json!({"sub": "dave"}), &key).unwrap();
    assert_eq!(auth(&config, &token).unwrap().role, "dave");
    // An RSA key under ES256 is a configuration error.
    let wrong = AuthenticationConfig { token_public_alg: "ES256".into(), ..rsa_config() };
    assert!(matches!(Authenticator::from_config(&wrong), Err(ConfigError::Key { .. })));
}

#[test]
fn public_key_derived_from_private_matches_openssl() {
    assert_eq!(keys::public_key_of(RSA_PRIVATE).unwrap(), RSA_PUBLIC);
    assert_eq!(keys::public_key_of(EC_PRIVATE).unwrap(), EC_PUBLIC);
}

#[test]
fn role_claim_and_audience() {
    let config = AuthenticationConfig {
        token_auth_claim: "role".into(),
        token_audience: "magnetar".into(),
        ..secret_config()
    };
    let ok = hs(json!({"role": ["ops", "x"], "aud": ["other", "magnetar"]}));
    assert_eq!(auth(&config, &ok).unwrap().role, "ops");
    let wrong_aud = hs(json!({"role": "ops", "aud": "other"}));
    assert_eq!(auth(&config, &wrong_aud), Err(AuthError::Audience));
    let no_aud = hs(json!({"role": "ops"}));
    assert_eq!(auth(&config, &no_aud), Err(AuthError::Audience));
    // Without token_audience, an audience claim is not looked at.
    assert_eq!(auth(&secret_config(), &hs(json!({"sub": "a", "aud": "x"}))).unwrap().role, "a");
    let no_role = hs(json!({"aud": "magnetar"}));
    assert_eq!(auth(&config, &no_role), Err(AuthError::NoRole("role".into())));
}

#[test]
fn key_forms_and_config_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("secret.key");
    std::fs::write(&path, SECRET).unwrap();
    let token = hs(json!({"sub": "alice"}));
    for form in [format!("file://{}", path.display()), path.display().to_string(), b64(SECRET)] {
        let config = AuthenticationConfig { token_secret_key: form, ..secret_config() };
        assert_eq!(auth(&config, &token).unwrap().role, "alice");
    }
    let missing = AuthenticationConfig {
        token_secret_key: "file:///nonexistent/secret.key".into(),
        ..secret_config()
    };
    let error = Authenticator::from_config(&missing).unwrap_err().to_string();
    assert!(error.contains("token_secret_key"), "{error}");
    let garbage = AuthenticationConfig {
        token_public_key: data_url(b"not a key at all, certainly not DER"),
        ..rsa_config()
    };
    let error = Authenticator::from_config(&garbage).unwrap_err().to_string();
    assert!(error.contains("SubjectPublicKeyInfo"), "{error}");
    let short = AuthenticationConfig { token_secret_key: data_url(b"short"), ..secret_config() };
    assert!(Authenticator::from_config(&short).is_err());
    let none = AuthenticationConfig { token_secret_key: String::new(), ..secret_config() };
    assert!(matches!(Authenticator::from_config(&none), Err(ConfigError::NoTokenKey)));
    let unknown = AuthenticationConfig { providers: vec!["kerberos".into()], ..secret_config() };
    assert!(matches!(Authenticator::from_config(&unknown), Err(ConfigError::UnknownProvider(_))));
    // Errors never print the key.
    let secret_text = b64(SECRET);
    for config in [missing, garbage] {
        let shown = format!("{:?}", Authenticator::from_config(&config).unwrap_err());
        assert!(!shown.contains(&secret_text));
    }
    // Disabled: nothing is checked.
    assert!(AuthenticationConfig { enabled: false, ..none.clone() }.validate().is_ok());
    assert!(none.validate().is_err());
}

#[test]
fn tls_provider_takes_the_certificate_common_name() {
    let config = AuthenticationConfig { providers: vec!["tls".into()], ..Default::default() };
    let authenticator = Authenticator::from_config(&config).unwrap();
    let identity =
        TransportIdentity { tls: true, client_cert_common_name: Some("client-1".into()) };
    let principal = authenticator.authenticate(Some("tls"), b"", &identity, NOW_MS).unwrap();
    assert_eq!((principal.role.as_str(), principal.method.as_str()), ("client-1", "tls"));
    let plain = TransportIdentity::default();
    assert_eq!(
        authenticator.authenticate(Some("tls"), b"", &plain, NOW_MS),
        Err(AuthError::NoClientCertificate)
    );
    let (method, result) = authenticator.authenticate_http(None, &identity, NOW_MS);
    assert_eq!((method, result.unwrap().role.as_str()), ("tls", "client-1"));
}

#[test]
fn basic_provider_apr1_md5_sha512() {
    let users = "# users\nalice:$apr1$saltsalt$LrttParrLPdxvgutaSXWJ0\n\
                 bob:$1$abcdefgh$cHJi5PXp/ki/ktXzqlk6I1\n\
                 carol:$6$abcdefgh$ltjgWl6579NluT/Vi1nwEvcil.G5Nbc4NiXZaNGStk8PSwGfQv72N2CKPPrVACtLtip/cZ/1GM/O6IND4WQhG.\n";
    let config = AuthenticationConfig {
        enabled: true,
        providers: vec!["basic".into()],
        basic_users_file: data_url(users.as_bytes()),
        ..Default::default()
    };
    let authenticator = Authenticator::from_config(&config).unwrap();
    let id = TransportIdentity::default();
    for user in ["alice", "bob", "carol"] {
        let data = format!("{user}:secret");
        let principal = authenticator.authenticate(Some("basic"), data.as_bytes(), &id, NOW_MS);
        assert_eq!(principal.unwrap().role, user);
        let wrong = format!("{user}:Secret");
        assert_eq!(
            authenticator.authenticate(Some("basic"), wrong.as_bytes(), &id, NOW_MS),
            Err(AuthError::BadPassword)
        );
    }
    assert_eq!(
        authenticator.authenticate(Some("basic"), b"nobody:secret", &id, NOW_MS),
        Err(AuthError::BadPassword)
    );
    assert!(matches!(
        authenticator.authenticate(Some("basic"), b"no colon", &id, NOW_MS),
        Err(AuthError::Malformed(_))
    ));
    assert!(matches!(
        authenticator.authenticate(Some("basic"), &[0xff, 0xfe, b':'], &id, NOW_MS),
        Err(AuthError::Malformed(_))
    ));
    let header = format!("Basic {}", b64(b"alice:secret"));
    let (method, result) = authenticator.authenticate_http(Some(header.as_bytes()), &id, NOW_MS);
    assert_eq!((method, result.unwrap().role.as_str()), ("basic", "alice"));
    let no_colon = format!("Basic {}", b64(b"alice"));
    let (_, result) = authenticator.authenticate_http(Some(no_colon.as_bytes()), &id, NOW_MS);
    assert!(matches!(result, Err(AuthError::Malformed(_))));
    assert!(basic::BasicProvider::parse("just a line").is_err());
}

#[test]
fn anonymous_and_unknown_methods() {
    let authenticator = Authenticator::from_config(&secret_config()).unwrap();
    let id = TransportIdentity::default();
    assert_eq!(authenticator.authenticate(None, b"", &id, NOW_MS), Err(AuthError::NoCredentials));
    assert_eq!(
        authenticator.authenticate(Some("kerberos"), b"x", &id, NOW_MS),
        Err(AuthError::UnknownMethod("kerberos".into()))
    );
    let config = AuthenticationConfig { anonymous_user_role: "guest".into(), ..secret_config() };
    let authenticator = Authenticator::from_config(&config).unwrap();
    let principal = authenticator.authenticate(None, b"", &id, NOW_MS).unwrap();
    assert_eq!((principal.role.as_str(), principal.method.as_str()), ("guest", "anonymous"));
    // Credentials that are present but bad are refused, not downgraded to anonymous.
    assert!(authenticator.authenticate(Some("token"), b"junk", &id, NOW_MS).is_err());
    let huge = vec![b'a'; MAX_AUTH_DATA + 1];
    assert_eq!(
        authenticator.authenticate(Some("token"), &huge, &id, NOW_MS),
        Err(AuthError::TooLarge)
    );
}

#[test]
fn http_bearer() {
    let authenticator = Authenticator::from_config(&secret_config()).unwrap();
    let id = TransportIdentity::default();
    let header = format!("Bearer {}", hs(json!({"sub": "alice"})));
    let (method, result) = authenticator.authenticate_http(Some(header.as_bytes()), &id, NOW_MS);
    assert_eq!((method, result.unwrap().role.as_str()), ("token", "alice"));
    let (_, result) = authenticator.authenticate_http(None, &id, NOW_MS);
    assert_eq!(result, Err(AuthError::NoCredentials));
    let (_, result) = authenticator.authenticate_http(Some(b"Negotiate abc"), &id, NOW_MS);
    assert!(matches!(result, Err(AuthError::UnknownMethod(_))));
}

#[test]
fn apr1_matches_openssl() {
    assert_eq!(
        basic::md5_crypt(b"secret", "$apr1$saltsalt$", "$apr1$"),
        "$apr1$saltsalt$LrttParrLPdxvgutaSXWJ0"
    );
}

#[test]
fn attempts_are_counted_by_method_and_reason() {
    let authenticator = Authenticator::from_config(&secret_config()).unwrap();
    let id = TransportIdentity::default();
    let token = hs(json!({"sub": "alice"}));
    authenticator.authenticate(Some("token"), token.as_bytes(), &id, NOW_MS).unwrap();
    let expired = hs(json!({"sub": "alice", "exp": 1}));
    let _ = authenticator.authenticate(Some("token"), expired.as_bytes(), &id, NOW_MS);
    let _ = authenticator.authenticate(Some("token"), expired.as_bytes(), &id, NOW_MS);
    let counts = authenticator.counts();
    let find = |reason| counts.iter().find(|c| c.reason == reason).map(|c| c.count);
    assert_eq!(find(None), Some(1));
    assert_eq!(find(Some("EXPIRED_TOKEN")), Some(2));
    assert!(counts.iter().all(|c| c.provider_name == "AuthenticationProviderToken"));
}

#[test]
fn generated_keys_sign_tokens_the_providers_accept() {
    let secret = keys::generate_secret(32);
    let claims = json!({"sub": "gen"});
    let headers = vec![("kid".to_string(), "k1".to_string())];
    let token = keys::sign_token(&secret, true, None, &headers, &claims).unwrap();
    assert!(token.starts_with(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","kid":"k1"}"#)
    ));
    let config = AuthenticationConfig { token_secret_key: data_url(&secret), ..secret_config() };
    assert_eq!(auth(&config, &token).unwrap().role, "gen");
    let (private, public) = keys::generate_key_pair(Algorithm::ES256).unwrap();
    let token = keys::sign_token(&private, false, None, &[], &claims).unwrap();
    let config = AuthenticationConfig {
        token_public_key: data_url(&public),
        token_public_alg: "ES256".into(),
        ..rsa_config()
    };
    assert_eq!(auth(&config, &token).unwrap().role, "gen");
    // The RSA test key signs RS256 by default; a secret-key algorithm with it is refused.
    let token = keys::sign_token(RSA_PRIVATE, false, None, &[], &claims).unwrap();
    assert_eq!(auth(&rsa_config(), &token).unwrap().role, "gen");
    assert!(keys::sign_token(RSA_PRIVATE, false, Some(Algorithm::HS256), &[], &claims).is_err());
}
