//! `magnetar tokens`: what `pulsar tokens` does, with the same key files (so Pulsar accepts
//! our keys and tokens, and we accept theirs): secret keys are raw bytes (base64 with
//! `--base64`), key pairs PKCS#8 DER (private) and X.509 SubjectPublicKeyInfo DER (public),
//! keys are given as `file:///path`, `data:;base64,...`, a path or base64 text.

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use magnetar_security::authentication::{keys, token::parse_algorithm, AuthenticationConfig};
use std::io::Write;
use std::path::PathBuf;

#[derive(Subcommand, Debug)]
pub enum TokensCommand {
    /// A new secret key for HS256 tokens (raw bytes, or base64 with --base64).
    CreateSecretKey(CreateSecretKeyArgs),
    /// A new key pair: PKCS#8 DER private key, X.509 DER public key.
    CreateKeyPair(CreateKeyPairArgs),
    /// A new token for a role, signed with a secret or private key.
    Create(CreateArgs),
    /// Checks a token with a secret or public key and prints its claims.
    Validate(ValidateArgs),
}

#[derive(Args, Debug)]
pub struct CreateSecretKeyArgs {
    /// HS256, HS384 or HS512 (sets the key length).
    #[arg(short = 'a', long = "signature-algorithm", default_value = "HS256")]
    pub algorithm: String,
    /// Write the key to this file (default: stdout).
    #[arg(short = 'o', long)]
    pub output: Option<PathBuf>,
    /// Write the key as base64 text.
    #[arg(short = 'b', long)]
    pub base64: bool,
}

#[derive(Args, Debug)]
pub struct CreateKeyPairArgs {
    /// RS256 (RSA 2048) or ES256 (P-256).
    #[arg(short = 'a', long = "signature-algorithm", default_value = "RS256")]
    pub algorithm: String,
    #[arg(long = "output-private-key")]
    pub private_key: PathBuf,
    #[arg(long = "output-public-key")]
    pub public_key: PathBuf,
}

#[derive(Args, Debug)]
pub struct CreateArgs {
    /// The signing algorithm (default: by the key: HS256.., RS256 or ES256).
    #[arg(short = 'a', long = "signature-algorithm")]
    pub algorithm: Option<String>,
    /// The role (the `sub` claim).
    #[arg(short = 's', long)]
    pub subject: String,
    /// Lifetime: 30s, 10m, 1h, 2d, 1w, 1y (no suffix: seconds). Default: never expires.
    #[arg(short = 'e', long = "expiry-time")]
    pub expiry_time: Option<String>,
    /// Secret key (file:///path, data:;base64,..., a path or base64).
    #[arg(long = "secret-key", conflicts_with = "private_key")]
    pub secret_key: Option<String>,
    /// Private key (PKCS#8 DER or PEM, same forms).
    #[arg(long = "private-key")]
    pub private_key: Option<String>,
    /// Extra header fields, key=value (repeatable).
    #[arg(long = "headers")]
    pub headers: Vec<String>,
}

#[derive(Args, Debug)]
pub struct ValidateArgs {
    /// The public key's algorithm family (RS256 or ES256).
    #[arg(short = 'a', long = "signature-algorithm", default_value = "RS256")]
    pub algorithm: String,
    #[arg(long = "secret-key", conflicts_with = "public_key")]
    pub secret_key: Option<String>,
    #[arg(long = "public-key")]
    pub public_key: Option<String>,
    /// The token.
    pub token: String,
}

pub fn run(command: TokensCommand) -> anyhow::Result<()> {
    match command {
        TokensCommand::CreateSecretKey(args) => {
            let bytes = match args.algorithm.as_str() {
                "HS256" => 32,
                "HS384" => 48,
                "HS512" => 64,
                other => bail!("unknown secret-key algorithm {other} (HS256, HS384, HS512)"),
            };
            let key = keys::generate_secret(bytes);
            let out = if args.base64 {
                use base64::Engine;
                base64::engine::general_purpose::STANDARD.encode(&key).into_bytes()
            } else {
                key
            };
            match args.output {
                Some(path) => write_private(&path, &out)?,
                None => std::io::stdout().write_all(&out)?,
            }
            Ok(())
        }
        TokensCommand::CreateKeyPair(args) => {
            let algorithm = parse_algorithm(&args.algorithm)
                .with_context(|| format!("unknown algorithm {}", args.algorithm))?;
            let (private, public) = keys::generate_key_pair(algorithm)?;
            write_private(&args.private_key, &private)?;
            std::fs::write(&args.public_key, public)
                .with_context(|| format!("write {}", args.public_key.display()))?;
            Ok(())
        }
        TokensCommand::Create(args) => {
            let (location, secret) = match (&args.secret_key, &args.private_key) {
                (Some(key), None) => (key, true),
                (None, Some(key)) => (key, false),
                _ => bail!("give one of --secret-key and --private-key"),
            };
            let key = keys::read_key(location).context("read the signing key")?;
            let algorithm = match &args.algorithm {
                Some(name) => Some(
                    parse_algorithm(name).with_context(|| format!("unknown algorithm {name}"))?,
                ),
                None => None,
            };
            let mut claims = serde_json::json!({ "sub": args.subject });
            if let Some(expiry) = &args.expiry_time {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .context("clock before 1970")?
                    .as_secs();
                claims["exp"] = (now + parse_relative_seconds(expiry)?).into();
            }
            let mut headers = Vec::new();
            for header in &args.headers {
                let (name, value) = header
                    .split_once('=')
                    .with_context(|| format!("header {header:?} is not k=v"))?;
                headers.push((name.to_string(), value.to_string()));
            }
            let token = keys::sign_token(&key, secret, algorithm, &headers, &claims)?;
            println!("{token}");
            Ok(())
        }
        TokensCommand::Validate(args) => {
            let mut config = AuthenticationConfig {
                enabled: true,
                token_public_alg: args.algorithm.clone(),
                ..Default::default()
            };
            match (args.secret_key, args.public_key) {
                (Some(key), None) => config.token_secret_key = key,
                (None, Some(key)) => config.token_public_key = key,
                _ => bail!("give one of --secret-key and --public-key"),
            }
            let provider =
                magnetar_security::authentication::token::TokenProvider::from_config(&config)?;
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .context("clock before 1970")?
                .as_millis() as u64;
            let token = args.token.trim();
            let principal =
                provider.authenticate(token, now_ms).map_err(|e| anyhow::anyhow!("{e}"))?;
            let claims = claims_of(token).unwrap_or_default();
            println!("{claims}");
            eprintln!("valid: role {}", principal.role);
            Ok(())
        }
    }
}

/// The claims part of a (validated) token, as JSON text.
fn claims_of(token: &str) -> Option<String> {
    use base64::Engine;
    let part = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(part).ok()?;
    String::from_utf8(bytes).ok()
}

/// A key file readable by its owner only.
fn write_private(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("write {}", path.display()))?;
    file.write_all(bytes)?;
    Ok(())
}

/// Pulsar's relative times: a number with s, m, h, d, w or y (none: seconds).
fn parse_relative_seconds(text: &str) -> anyhow::Result<u64> {
    let text = text.trim();
    let (number, unit) = match text.char_indices().last() {
        Some((at, c)) if c.is_ascii_alphabetic() => (&text[..at], c.to_ascii_lowercase()),
        _ => (text, 's'),
    };
    let number: u64 = number.parse().with_context(|| format!("bad time {text:?}"))?;
    let unit = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        'w' => 7 * 86_400,
        'y' => 365 * 86_400,
        _ => bail!("bad time unit in {text:?} (s, m, h, d, w, y)"),
    };
    number.checked_mul(unit).context("time too large")
}

#[cfg(test)]
mod tests {
    use super::parse_relative_seconds;

    #[test]
    fn relative_times() {
        assert_eq!(parse_relative_seconds("30").unwrap(), 30);
        assert_eq!(parse_relative_seconds("10m").unwrap(), 600);
        assert_eq!(parse_relative_seconds("1h").unwrap(), 3600);
        assert_eq!(parse_relative_seconds("2d").unwrap(), 172_800);
        assert_eq!(parse_relative_seconds("1y").unwrap(), 31_536_000);
        assert!(parse_relative_seconds("1x").is_err());
        assert!(parse_relative_seconds("h").is_err());
    }
}
