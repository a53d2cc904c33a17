//! The `--metadata` URL of `magnetar broker` and `magnetar metadata init`: which etcd to use.
//!
//! Accepted forms (whitespace around endpoints is ignored):
//! * `etcd://host:port,host2:port2` (the port defaults to 2379: `etcd://host`);
//! * `etcd://http://host:port,http://host2:port2`, and plain `http://host:port,...` (what etcd
//!   itself prints as its client URLs); a trailing `/` on an endpoint is dropped;
//! * IPv6 literals in brackets: `etcd://[::1]:2379`.
//!
//! Refused, each with its own [`MetadataUrlError`]: other schemes (`zk://`, `https://`: TLS is
//! not supported yet), empty endpoint lists or endpoints, user info, paths, queries, bad
//! ports (0, not a number, above 65535), hosts with characters no host name or address has.
//!
//! Output: endpoint URLs `http://host:port`, in the order given, without duplicates.

use thiserror::Error;

/// etcd's client port, used when an endpoint names none.
pub const DEFAULT_ETCD_PORT: u16 = 2379;

/// Why a metadata URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MetadataUrlError {
    /// The URL does not start with `etcd://` or `http://`.
    #[error("metadata URL {0:?} must start with etcd:// (etcd://host:2379,host2:2379) or http://")]
    UnsupportedScheme(String),
    /// No endpoint at all, or an empty one between commas.
    #[error("metadata URL {0:?} has an empty endpoint")]
    EmptyEndpoint(String),
    /// An endpoint with a scheme other than `http://` (e.g. `https://`: no TLS yet).
    #[error("etcd endpoint {0:?}: only http:// endpoints are supported")]
    UnsupportedEndpointScheme(String),
    /// A path, query, fragment or user info after the host.
    #[error("etcd endpoint {0:?} must be host:port, without path, query or user")]
    NotHostPort(String),
    /// A port that is not 1..=65535.
    #[error("etcd endpoint {0:?} has an invalid port (1-65535)")]
    BadPort(String),
    /// A host with characters no host name or IP address has.
    #[error("etcd endpoint {0:?} has an invalid host")]
    BadHost(String),
}

/// Parses a metadata URL (see the module docs) into etcd endpoint URLs.
pub fn parse_metadata_url(url: &str) -> Result<Vec<String>, MetadataUrlError> {
    let trimmed = url.trim();
    let list = if let Some(rest) = trimmed.strip_prefix("etcd://") {
        rest
    } else if trimmed.starts_with("http://") {
        trimmed
    } else {
        return Err(MetadataUrlError::UnsupportedScheme(url.to_string()));
    };
    let mut endpoints: Vec<String> = Vec::new();
    for raw in list.split(',') {
        let endpoint = parse_endpoint(raw.trim(), url)?;
        if !endpoints.contains(&endpoint) {
            endpoints.push(endpoint);
        }
    }
    assert!(!endpoints.is_empty(), "split always yields one item, and empty items are refused");
    Ok(endpoints)
}

fn parse_endpoint(raw: &str, url: &str) -> Result<String, MetadataUrlError> {
    if raw.is_empty() {
        return Err(MetadataUrlError::EmptyEndpoint(url.to_string()));
    }
    let rest = match raw.split_once("://") {
        Some(("http", rest)) => rest,
        Some(_) => return Err(MetadataUrlError::UnsupportedEndpointScheme(raw.to_string())),
        None => raw,
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() {
        return Err(MetadataUrlError::EmptyEndpoint(url.to_string()));
    }
    if rest.contains(['/', '?', '#', '@']) {
        return Err(MetadataUrlError::NotHostPort(raw.to_string()));
    }
    let (host, port) = split_host_port(rest, raw)?;
    let port = match port {
        None => DEFAULT_ETCD_PORT,
        Some(p) => match p.parse::<u16>() {
            // Plain decimal only: `2379`, not `+2379` or `02379`.
            Ok(n) if n > 0 && n.to_string() == p => n,
            _ => return Err(MetadataUrlError::BadPort(raw.to_string())),
        },
    };
    Ok(format!("http://{host}:{port}"))
}

/// Splits `host[:port]` / `[v6][:port]`, checking the host's characters.
fn split_host_port<'a>(
    rest: &'a str,
    raw: &str,
) -> Result<(&'a str, Option<&'a str>), MetadataUrlError> {
    let bad_host = || MetadataUrlError::BadHost(raw.to_string());
    if let Some(v6) = rest.strip_prefix('[') {
        let (inside, after) = v6.split_once(']').ok_or_else(bad_host)?;
        if inside.is_empty() || !inside.bytes().all(|b| b.is_ascii_hexdigit() || b == b':') {
            return Err(bad_host());
        }
        let host = &rest[..inside.len() + 2];
        return match after {
            "" => Ok((host, None)),
            _ => match after.strip_prefix(':') {
                Some(port) => Ok((host, Some(port))),
                None => Err(bad_host()),
            },
        };
    }
    let (host, port) = match rest.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (rest, None),
    };
    let host_ok = !host.is_empty()
        && host.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'));
    if !host_ok {
        return Err(bad_host());
    }
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(url: &str) -> Vec<String> {
        parse_metadata_url(url).unwrap_or_else(|e| panic!("{url:?}: {e}"))
    }

    #[test]
    fn accepted_forms() {
        assert_eq!(ok("etcd://127.0.0.1:2379"), ["http://127.0.0.1:2379"]);
        assert_eq!(
            ok("etcd://h1:2379,h2.example:22379"),
            ["http://h1:2379", "http://h2.example:22379"]
        );
        assert_eq!(ok("etcd://etcd-0"), ["http://etcd-0:2379"], "default port");
        assert_eq!(
            ok("http://a:1,http://b:2/"),
            ["http://a:1", "http://b:2"],
            "etcd's own client URL form"
        );
        assert_eq!(ok("etcd://http://a:1, b:2"), ["http://a:1", "http://b:2"]);
        assert_eq!(
            ok("etcd://[::1]:2379,[fe80::1]"),
            ["http://[::1]:2379", "http://[fe80::1]:2379"]
        );
        assert_eq!(ok(" etcd://a:1,a:1 "), ["http://a:1"], "duplicates dropped, spaces trimmed");
    }

    #[test]
    fn refused_forms() {
        use MetadataUrlError::*;
        type Expect = fn(&MetadataUrlError) -> bool;
        let cases: [(&str, Expect); 16] = [
            ("", |e| matches!(e, UnsupportedScheme(_))),
            ("127.0.0.1:2379", |e| matches!(e, UnsupportedScheme(_))),
            ("zk://h:2181", |e| matches!(e, UnsupportedScheme(_))),
            ("https://h:2379", |e| matches!(e, UnsupportedScheme(_))),
            ("etcd://", |e| matches!(e, EmptyEndpoint(_))),
            ("etcd://a:1,,b:2", |e| matches!(e, EmptyEndpoint(_))),
            ("etcd://a:1,", |e| matches!(e, EmptyEndpoint(_))),
            ("etcd://https://a:1", |e| matches!(e, UnsupportedEndpointScheme(_))),
            ("etcd://a:1/path", |e| matches!(e, NotHostPort(_))),
            ("etcd://user@a:1", |e| matches!(e, NotHostPort(_))),
            ("etcd://a:0", |e| matches!(e, BadPort(_))),
            ("etcd://a:65536", |e| matches!(e, BadPort(_))),
            ("etcd://a:x", |e| matches!(e, BadPort(_))),
            ("etcd://a:+1", |e| matches!(e, BadPort(_))),
            ("etcd://a b:1", |e| matches!(e, BadHost(_))),
            ("etcd://[::1:2379", |e| matches!(e, BadHost(_))),
        ];
        for (url, expected) in cases {
            match parse_metadata_url(url) {
                Ok(v) => panic!("{url:?} accepted as {v:?}"),
                Err(e) => {
                    assert!(expected(&e), "{url:?}: unexpected error {e:?}");
                    assert!(!e.to_string().contains('\n'), "one-line message: {e}");
                }
            }
        }
        assert!(parse_metadata_url("etcd://:1").is_err(), "empty host");
        assert!(parse_metadata_url("etcd://a:01").is_err(), "leading zero");
    }
}
