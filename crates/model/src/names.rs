//! Pulsar naming rules: topic domains, tenant / namespace / topic names, and the URL codec
//! Pulsar uses for topic names in REST paths and metadata keys.
//!
//! Everything here is pure (no I/O, no HTTP types) so the broker can reuse it.
//!
//! Rules, following `org.apache.pulsar.common.naming.{NamedEntity, NamespaceName, TopicName}`:
//! * tenant, namespace (and cluster) names match `^[-=:.\w]+$` with ASCII `\w`;
//! * a topic's local name is any non-empty string;
//! * a partition is named `{base}-partition-{i}` with `i` a canonical non-negative integer.
//!
//! Deliberate restrictions beyond Pulsar (each would produce a name that cannot be stored or
//! addressed safely): the names `.` and `..` are rejected (HTTP clients normalise them away and
//! the metadata store forbids them as path segments), topic local names may not contain `/`
//! (Pulsar would silently reinterpret such a name as a legacy 4-part name), and names longer than
//! [`MAX_NAME_LEN`] (tenant / namespace) or [`MAX_ENCODED_TOPIC_LEN`] (encoded topic) are
//! rejected so that every derived metadata key stays below the store's key limit.
//!
//! Invariant: no function here panics, whatever the input.

use std::fmt;

use thiserror::Error;

/// Suffix separating a partitioned topic's base name from the partition index.
pub const PARTITIONED_TOPIC_SUFFIX: &str = "-partition-";

/// Longest accepted tenant, namespace or cluster name, in bytes.
pub const MAX_NAME_LEN: usize = 256;

/// Longest accepted topic local name once encoded with [`encode_topic_name`], in bytes.
pub const MAX_ENCODED_TOPIC_LEN: usize = 2048;

/// Why a name was rejected.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NameError {
    /// The tenant name is not valid.
    #[error("invalid tenant name {0:?}")]
    Tenant(String),
    /// The namespace name is not valid.
    #[error("invalid namespace name {0:?}")]
    Namespace(String),
    /// The topic name is not valid.
    #[error("invalid topic name {0:?}")]
    Topic(String),
    /// The domain is neither `persistent` nor `non-persistent`.
    #[error("invalid topic domain {0:?}")]
    Domain(String),
}

/// Truncates user input for error messages so absurd input cannot produce absurd messages.
fn shown(s: &str) -> String {
    s.chars().take(128).collect()
}

/// A topic domain: `persistent` or `non-persistent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TopicDomain {
    /// `persistent://…` topics, stored in ledgers.
    Persistent,
    /// `non-persistent://…` topics, kept in memory only.
    NonPersistent,
}

impl TopicDomain {
    /// Both domains, persistent first.
    pub const ALL: [TopicDomain; 2] = [TopicDomain::Persistent, TopicDomain::NonPersistent];

    /// The domain as it appears in topic names, REST paths and metadata keys.
    pub fn as_str(self) -> &'static str {
        match self {
            TopicDomain::Persistent => "persistent",
            TopicDomain::NonPersistent => "non-persistent",
        }
    }

    /// Parses `persistent` / `non-persistent` (exact, case-sensitive, as Pulsar does).
    pub fn parse(s: &str) -> Result<Self, NameError> {
        match s {
            "persistent" => Ok(TopicDomain::Persistent),
            "non-persistent" => Ok(TopicDomain::NonPersistent),
            other => Err(NameError::Domain(shown(other))),
        }
    }
}

impl fmt::Display for TopicDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether `name` is a valid tenant, namespace or cluster name (Pulsar's `NamedEntity` rule,
/// non-empty, plus the restrictions in the module docs).
pub fn is_valid_entity_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'=' | b':' | b'.'))
}

/// Validates a tenant name.
pub fn validate_tenant(tenant: &str) -> Result<(), NameError> {
    if is_valid_entity_name(tenant) {
        Ok(())
    } else {
        Err(NameError::Tenant(shown(tenant)))
    }
}

/// A validated `tenant/namespace` pair.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NamespaceName {
    tenant: String,
    namespace: String,
}

impl NamespaceName {
    /// Validates and builds a namespace name.
    pub fn new(tenant: &str, namespace: &str) -> Result<Self, NameError> {
        if !is_valid_entity_name(tenant) || !is_valid_entity_name(namespace) {
            return Err(NameError::Namespace(format!("{}/{}", shown(tenant), shown(namespace))));
        }
        Ok(NamespaceName { tenant: tenant.to_string(), namespace: namespace.to_string() })
    }

    /// Parses `tenant/namespace`.
    pub fn parse(s: &str) -> Result<Self, NameError> {
        match s.split_once('/') {
            Some((t, n)) => NamespaceName::new(t, n),
            None => Err(NameError::Namespace(shown(s))),
        }
    }

    /// The tenant part.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// The namespace part (without the tenant).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }
}

impl fmt::Display for NamespaceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.tenant, self.namespace)
    }
}

/// A validated v2 topic name: `{domain}://{tenant}/{namespace}/{local_name}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicName {
    domain: TopicDomain,
    namespace: NamespaceName,
    local_name: String,
}

impl TopicName {
    /// Validates and builds a topic name from its parts. `local_name` is the decoded name.
    pub fn new(
        domain: TopicDomain,
        namespace: NamespaceName,
        local_name: &str,
    ) -> Result<Self, NameError> {
        if local_name.is_empty()
            || local_name == "."
            || local_name == ".."
            || local_name.contains('/')
            || encoded_len(local_name) > MAX_ENCODED_TOPIC_LEN
        {
            return Err(NameError::Topic(shown(local_name)));
        }
        Ok(TopicName { domain, namespace, local_name: local_name.to_string() })
    }

    /// Parses a full name `persistent://tenant/namespace/topic` (v2 form only).
    pub fn parse(full: &str) -> Result<Self, NameError> {
        let (domain, rest) = full.split_once("://").ok_or_else(|| NameError::Topic(shown(full)))?;
        let domain = TopicDomain::parse(domain)?;
        let mut parts = rest.splitn(3, '/');
        let (Some(t), Some(n), Some(local)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(NameError::Topic(shown(full)));
        };
        let ns = NamespaceName::new(t, n)?;
        TopicName::new(domain, ns, local)
    }

    /// Expands the short forms clients accept, as Pulsar's `TopicName.get` does:
    /// `my-topic` → `persistent://public/default/my-topic`, `tenant/ns/t` →
    /// `persistent://tenant/ns/t`; a full name is parsed as [`TopicName::parse`].
    pub fn expand(name: &str) -> Result<Self, NameError> {
        if name.contains("://") {
            return TopicName::parse(name);
        }
        match name.matches('/').count() {
            0 => TopicName::new(
                TopicDomain::Persistent,
                NamespaceName::new("public", "default")?,
                name,
            ),
            2 => TopicName::parse(&format!("persistent://{name}")),
            _ => Err(NameError::Topic(shown(name))),
        }
    }

    /// The domain.
    pub fn domain(&self) -> TopicDomain {
        self.domain
    }

    /// The namespace.
    pub fn namespace(&self) -> &NamespaceName {
        &self.namespace
    }

    /// The tenant.
    pub fn tenant(&self) -> &str {
        self.namespace.tenant()
    }

    /// The decoded local name (the part after the namespace).
    pub fn local_name(&self) -> &str {
        &self.local_name
    }

    /// The local name encoded as Pulsar's `Codec.encode` does (used in keys and REST paths).
    pub fn encoded_local_name(&self) -> String {
        encode_topic_name(&self.local_name)
    }

    /// The partition index when this names a partition (`…-partition-3` → `Some(3)`).
    pub fn partition_index(&self) -> Option<u32> {
        partition_index(&self.local_name)
    }

    /// The name of partition `index` of this (partitioned) topic.
    pub fn partition(&self, index: u32) -> TopicName {
        TopicName {
            domain: self.domain,
            namespace: self.namespace.clone(),
            local_name: format!("{}{PARTITIONED_TOPIC_SUFFIX}{index}", self.local_name),
        }
    }

    /// For a partition, the partitioned topic it belongs to; otherwise a copy of `self`.
    pub fn partitioned_topic(&self) -> TopicName {
        match self.partition_index() {
            Some(_) => {
                let base = self
                    .local_name
                    .rfind(PARTITIONED_TOPIC_SUFFIX)
                    .map_or(self.local_name.as_str(), |i| &self.local_name[..i]);
                TopicName {
                    domain: self.domain,
                    namespace: self.namespace.clone(),
                    local_name: base.to_string(),
                }
            }
            None => self.clone(),
        }
    }
}

impl fmt::Display for TopicName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}/{}", self.domain, self.namespace, self.local_name)
    }
}

/// The partition index encoded in a local name, as Pulsar's `TopicName.getPartitionIndex`:
/// the text after the last `-partition-` must be a canonical non-negative integer (no sign, no
/// leading zeros), otherwise the name is not a partition.
pub fn partition_index(local_name: &str) -> Option<u32> {
    let pos = local_name.rfind(PARTITIONED_TOPIC_SUFFIX)?;
    let idx = &local_name[pos + PARTITIONED_TOPIC_SUFFIX.len()..];
    if idx.is_empty() || !idx.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if idx.len() > 1 && idx.starts_with('0') {
        return None;
    }
    // Pulsar parses an int; anything beyond i32::MAX is not a partition there either.
    let value: u32 = idx.parse().ok()?;
    (value <= i32::MAX as u32).then_some(value)
}

/// Whether a topic is a Pulsar system topic (hidden from listings unless asked for). This is an
/// approximation of Pulsar's `SystemTopicNames`: anything in the `pulsar/system` namespace, and
/// local names (of the partitioned base) starting with `__`, such as `__change_events`.
pub fn is_system_topic(topic: &TopicName) -> bool {
    if topic.tenant() == "pulsar" && topic.namespace().namespace() == "system" {
        return true;
    }
    let base = topic.partitioned_topic();
    base.local_name().starts_with("__") || base.local_name().ends_with("__transaction_pending_ack")
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'*' | b'_')
}

fn encoded_len(s: &str) -> usize {
    s.bytes().map(|b| if is_unreserved(b) || b == b' ' { 1 } else { 3 }).sum()
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Encodes a topic local name exactly like Java's `URLEncoder.encode(s, UTF_8)` (Pulsar's
/// `Codec.encode`): ASCII letters, digits and `.-*_` stay, space becomes `+`, every other byte
/// of the UTF-8 form becomes `%XX` (upper-case hex).
pub fn encode_topic_name(s: &str) -> String {
    let mut out = String::with_capacity(encoded_len(s));
    for b in s.bytes() {
        if is_unreserved(b) {
            out.push(b as char);
        } else if b == b' ' {
            out.push('+');
        } else {
            out.push('%');
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 0xf)] as char);
        }
    }
    out
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn percent_decode_bytes(s: &str, plus_is_space: bool) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hi = hex_val(*bytes.get(i + 1)?)?;
                let lo = hex_val(*bytes.get(i + 2)?)?;
                out.push(hi << 4 | lo);
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// Decodes a topic local name like Java's `URLDecoder.decode(s, UTF_8)` (Pulsar's
/// `Codec.decode`): `+` becomes a space and `%XX` sequences are decoded. Returns `None` for a
/// malformed escape or a result that is not UTF-8 (Pulsar would fail or substitute there).
pub fn decode_topic_name(s: &str) -> Option<String> {
    percent_decode_bytes(s, true)
}

/// Percent-decodes one URL path segment the way JAX-RS does for `@PathParam` (no `+`
/// handling). Returns `None` for a malformed escape or non-UTF-8 result.
pub fn decode_path_segment(s: &str) -> Option<String> {
    percent_decode_bytes(s, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entity_names() {
        for ok in ["public", "a-b_c=d:e.f", "X9", "a.b"] {
            assert!(is_valid_entity_name(ok), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", "a b", "ü", "a%b", "a\0", &"x".repeat(300)] {
            assert!(!is_valid_entity_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn codec_matches_java() {
        assert_eq!(encode_topic_name("my topic"), "my+topic");
        assert_eq!(encode_topic_name("a+b/c"), "a%2Bb%2Fc");
        assert_eq!(encode_topic_name("ü*-._~"), "%C3%BC*-._%7E");
        assert_eq!(decode_topic_name("my+topic").as_deref(), Some("my topic"));
        assert_eq!(decode_topic_name("a%2Bb%2fc").as_deref(), Some("a+b/c"));
        assert_eq!(decode_topic_name("%C3%BC").as_deref(), Some("ü"));
        assert_eq!(decode_topic_name("%"), None);
        assert_eq!(decode_topic_name("%zz"), None);
        assert_eq!(decode_topic_name("%FF"), None);
        assert_eq!(decode_path_segment("a+b").as_deref(), Some("a+b"));
        for s in ["x", "a b+c/d%e", "ü€😀", "\u{1}\n"] {
            assert_eq!(decode_topic_name(&encode_topic_name(s)).as_deref(), Some(s));
        }
    }

    #[test]
    fn partitions() {
        assert_eq!(partition_index("t-partition-0"), Some(0));
        assert_eq!(partition_index("t-partition-12"), Some(12));
        assert_eq!(partition_index("t-partition-01"), None);
        assert_eq!(partition_index("t-partition--1"), None);
        assert_eq!(partition_index("t-partition-"), None);
        assert_eq!(partition_index("t-partition-99999999999"), None);
        assert_eq!(partition_index("t"), None);
        let ns = NamespaceName::new("public", "default").unwrap();
        let t = TopicName::new(TopicDomain::Persistent, ns, "a-partition-x-partition-3").unwrap();
        assert_eq!(t.partition_index(), Some(3));
        assert_eq!(t.partitioned_topic().local_name(), "a-partition-x");
        assert_eq!(
            t.partitioned_topic().partition(1).to_string(),
            "persistent://public/default/a-partition-x-partition-1"
        );
    }

    #[test]
    fn topic_names() {
        let t = TopicName::parse("non-persistent://public/default/my topic").unwrap();
        assert_eq!(t.domain(), TopicDomain::NonPersistent);
        assert_eq!(t.encoded_local_name(), "my+topic");
        assert_eq!(t.to_string(), "non-persistent://public/default/my topic");
        for bad in [
            "persistent://public/default/",
            "persistent://public/default/a/b",
            "persistent://public/default/..",
            "persistent://pub lic/default/x",
            "other://public/default/x",
            "public/default/x",
            "persistent://public",
        ] {
            assert!(TopicName::parse(bad).is_err(), "{bad}");
        }
        let long = "€".repeat(MAX_ENCODED_TOPIC_LEN / 9 + 1);
        let ns = NamespaceName::new("t", "n").unwrap();
        assert!(TopicName::new(TopicDomain::Persistent, ns, &long).is_err());
    }

    #[test]
    fn system_topics() {
        let sys = TopicName::parse("persistent://public/default/__change_events-partition-0");
        assert!(is_system_topic(&sys.unwrap()));
        assert!(is_system_topic(&TopicName::parse("persistent://pulsar/system/x").unwrap()));
        assert!(!is_system_topic(&TopicName::parse("persistent://public/default/x").unwrap()));
    }

    #[test]
    fn short_names_expand_as_pulsar_clients_do() {
        let full = |s: &str| TopicName::expand(s).map(|t| t.to_string());
        assert_eq!(full("t").unwrap(), "persistent://public/default/t");
        assert_eq!(full("a/b/t").unwrap(), "persistent://a/b/t");
        assert_eq!(full("non-persistent://a/b/t").unwrap(), "non-persistent://a/b/t");
        assert!(full("a/t").is_err(), "two parts name neither a topic nor a v2 namespace topic");
        assert!(full("").is_err());
    }
}
