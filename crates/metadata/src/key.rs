//! Key, path and prefix validation, and size limits.
//!
//! Keys are absolute '/'-separated paths such as `/topics/public/default/persistent/t1`.
//! Invariants enforced here (and relied on by every back end and by the on-disk format):
//! a valid key is non-empty, starts with '/', is not the root "/" itself, has no empty
//! segment (so no "//" and no trailing '/'), no "." or ".." segment, no NUL or other ASCII
//! control character, and is at most [`MAX_KEY_LEN`] bytes. Validation never panics.

use crate::error::{MetadataError, Result};

/// Longest accepted key, path or prefix, in bytes.
pub const MAX_KEY_LEN: usize = 4096;

/// Largest accepted value, in bytes (schemas can be a few MiB; etcd's default limit is 1.5 MiB,
/// so a broker that wants to stay portable should keep values well below this).
pub const MAX_VALUE_LEN: usize = 16 * 1024 * 1024;

fn invalid(key: &str, reason: &'static str) -> MetadataError {
    // Keep error messages bounded even for absurd input.
    let shown: String = key.chars().take(256).collect();
    MetadataError::InvalidKey { key: shown, reason }
}

fn check_common(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(invalid(key, "empty"));
    }
    if !key.starts_with('/') {
        return Err(invalid(key, "must start with '/'"));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(invalid(key, "longer than MAX_KEY_LEN"));
    }
    if key.chars().any(|c| c.is_ascii_control()) {
        return Err(invalid(key, "contains a control character"));
    }
    Ok(())
}

/// Validates a key used by `get`, `put` and `delete`.
pub fn validate_key(key: &str) -> Result<()> {
    check_common(key)?;
    if key == "/" {
        return Err(invalid(key, "the root \"/\" cannot hold a value"));
    }
    for segment in key[1..].split('/') {
        match segment {
            "" => return Err(invalid(key, "empty path segment")),
            "." | ".." => return Err(invalid(key, "\".\" and \"..\" segments are not allowed")),
            _ => {}
        }
    }
    Ok(())
}

/// Validates a path given to `list_children`: a valid key, or the root "/".
pub fn validate_path(path: &str) -> Result<()> {
    if path == "/" {
        return Ok(());
    }
    validate_key(path)
}

/// Validates a prefix given to `list` or `watch`: any string that starts with '/'
/// (matching is plain string-prefix matching, so "/a" also matches "/ab").
pub fn validate_prefix(prefix: &str) -> Result<()> {
    check_common(prefix)
}

/// Validates the size of a value about to be written.
pub(crate) fn validate_value(key: &str, len: usize) -> Result<()> {
    if len > MAX_VALUE_LEN {
        return Err(MetadataError::ValueTooLarge { key: key.to_string(), len, max: MAX_VALUE_LEN });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_normal_keys() {
        for k in ["/a", "/a/b", "/topics/public/default/persistent/t-1", "/a b/ü"] {
            assert!(validate_key(k).is_ok(), "{k}");
        }
    }

    #[test]
    fn rejects_bad_keys() {
        let long = format!("/{}", "x".repeat(MAX_KEY_LEN));
        for k in
            ["", "a", "a/b", "/", "/a/", "//a", "/a//b", "/a/./b", "/a/..", "/a\0b", "/a\nb", &long]
        {
            assert!(matches!(validate_key(k), Err(MetadataError::InvalidKey { .. })), "{k:?}");
        }
    }

    #[test]
    fn paths_and_prefixes() {
        assert!(validate_path("/").is_ok());
        assert!(validate_path("/a/").is_err());
        assert!(validate_prefix("/").is_ok());
        assert!(validate_prefix("/a/").is_ok());
        assert!(validate_prefix("/a/b").is_ok());
        assert!(validate_prefix("").is_err());
        assert!(validate_prefix("a").is_err());
    }
}
