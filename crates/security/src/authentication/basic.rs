//! The `basic` provider: users and password hashes from a file in the format Pulsar's
//! `AuthenticationProviderBasic` reads (`user:hash` per line, as `htpasswd` writes them):
//! hashes starting with `$apr1$` are APR1-MD5, the others crypt(3) (`$1$` MD5, `$5$` SHA-256,
//! `$6$` SHA-512, or traditional DES).

use super::{keys, AuthError};
use crate::Principal;
use md5::{Digest, Md5};
use std::collections::HashMap;

/// A users file that cannot be read or parsed (never shows a hash).
#[derive(Debug, thiserror::Error)]
pub enum UsersError {
    #[error("{0}")]
    Read(#[from] keys::KeyError),
    #[error("not UTF-8 text")]
    Utf8,
    #[error("line {0} is not user:hash")]
    Line(usize),
    #[error("no users")]
    Empty,
}

pub struct BasicProvider {
    users: HashMap<String, String>,
}

impl BasicProvider {
    /// Loads the users file (a path, `file:` or `data:` URL, as for keys).
    pub fn load(location: &str) -> Result<BasicProvider, UsersError> {
        let bytes = keys::read_key(location)?;
        let text = std::str::from_utf8(&bytes).map_err(|_| UsersError::Utf8)?;
        BasicProvider::parse(text)
    }

    /// Parses `user:hash` lines (blank lines and `#` comments skipped).
    pub fn parse(text: &str) -> Result<BasicProvider, UsersError> {
        let mut users = HashMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (user, hash) = line.split_once(':').ok_or(UsersError::Line(n + 1))?;
            if user.is_empty() || hash.is_empty() {
                return Err(UsersError::Line(n + 1));
            }
            users.insert(user.to_string(), hash.to_string());
        }
        if users.is_empty() {
            return Err(UsersError::Empty);
        }
        Ok(BasicProvider { users })
    }

    pub fn authenticate(&self, user: &str, password: &str) -> Result<Principal, AuthError> {
        let hash = self.users.get(user).ok_or(AuthError::BadPassword)?;
        if verify(password, hash) {
            Ok(Principal { role: user.to_string(), method: "basic".into(), expires_at_ms: None })
        } else {
            Err(AuthError::BadPassword)
        }
    }
}

/// Whether `password` matches a stored hash.
pub fn verify(password: &str, hash: &str) -> bool {
    let computed = if hash.starts_with("$apr1$") {
        Some(md5_crypt(password.as_bytes(), hash, "$apr1$"))
    } else {
        pwhash::unix::crypt(password, hash).ok()
    };
    match computed {
        Some(computed) => constant_time_eq(computed.as_bytes(), hash.as_bytes()),
        None => false,
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

const ITOA64: &[u8] = b"./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// The MD5-based crypt (`$1$`) with a given magic (`$apr1$` for Apache's variant): the salt is
/// taken from `setting` (after the magic, up to 8 characters, up to a `$`).
pub fn md5_crypt(password: &[u8], setting: &str, magic: &str) -> String {
    let rest = setting.strip_prefix(magic).unwrap_or(setting);
    let salt: &str = rest.split('$').next().unwrap_or("");
    let salt = &salt.as_bytes()[..salt.len().min(8)];
    let mut ctx = Md5::new();
    ctx.update(password);
    ctx.update(magic.as_bytes());
    ctx.update(salt);
    let mut alt = Md5::new();
    alt.update(password);
    alt.update(salt);
    alt.update(password);
    let alt = alt.finalize();
    let mut left = password.len();
    while left > 0 {
        let n = left.min(16);
        ctx.update(&alt[..n]);
        left -= n;
    }
    let mut i = password.len();
    while i > 0 {
        if i & 1 == 1 {
            ctx.update([0u8]);
        } else {
            ctx.update(&password[..1]);
        }
        i >>= 1;
    }
    let mut digest = ctx.finalize();
    for round in 0..1000 {
        let mut c = Md5::new();
        if round & 1 == 1 {
            c.update(password);
        } else {
            c.update(digest);
        }
        if round % 3 != 0 {
            c.update(salt);
        }
        if round % 7 != 0 {
            c.update(password);
        }
        if round & 1 == 1 {
            c.update(digest);
        } else {
            c.update(password);
        }
        digest = c.finalize();
    }
    let d = digest;
    let mut out = String::with_capacity(magic.len() + salt.len() + 23);
    out.push_str(magic);
    out.push_str(&String::from_utf8_lossy(salt));
    out.push('$');
    let mut to64 = |mut v: u32, n: usize| {
        for _ in 0..n {
            out.push(char::from(ITOA64[(v & 0x3f) as usize]));
            v >>= 6;
        }
    };
    for (a, b, c) in [(0, 6, 12), (1, 7, 13), (2, 8, 14), (3, 9, 15), (4, 10, 5)] {
        to64((u32::from(d[a]) << 16) | (u32::from(d[b]) << 8) | u32::from(d[c]), 4);
    }
    to64(u32::from(d[11]), 2);
    out
}
