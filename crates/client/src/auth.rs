//! The credentials a client presents: at CONNECT, and again whenever the broker challenges
//! them (its tokens expire: AUTH_CHALLENGE, answered with AUTH_RESPONSE, as the official
//! clients do). Only Pulsar's token method for now.

use std::path::PathBuf;

use crate::error::{Error, Result};

/// Pulsar's name of the token authentication method.
pub(crate) const TOKEN_METHOD: &str = "token";

/// Where a client's token comes from.
#[derive(Debug, Clone)]
pub(crate) enum Credentials {
    /// A fixed token.
    Token(String),
    /// A file read afresh at each connection and each challenge: a token another process
    /// rotates (the official clients' `file://` token).
    TokenFile(PathBuf),
}

impl Credentials {
    /// The token to present now (whitespace around a file's token is ignored).
    pub(crate) fn token(&self) -> Result<String> {
        match self {
            Credentials::Token(token) => Ok(token.clone()),
            Credentials::TokenFile(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    Error::Config(format!("cannot read the token file {}: {e}", path.display()))
                })?;
                let token = text.trim();
                if token.is_empty() {
                    return Err(Error::Config(format!(
                        "the token file {} is empty",
                        path.display()
                    )));
                }
                Ok(token.to_string())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_file_is_read_afresh_each_time() {
        let dir = std::env::temp_dir().join(format!("magnetar-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        let credentials = Credentials::TokenFile(path.clone());
        assert!(matches!(credentials.token(), Err(Error::Config(_))), "missing file");
        std::fs::write(&path, "first\n").unwrap();
        assert_eq!(credentials.token().unwrap(), "first");
        std::fs::write(&path, "  second  ").unwrap();
        assert_eq!(credentials.token().unwrap(), "second");
        std::fs::write(&path, "\n").unwrap();
        assert!(matches!(credentials.token(), Err(Error::Config(_))), "empty file");
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(Credentials::Token("t".into()).token().unwrap(), "t");
    }
}
