//! The schema registry: the schemas of a topic (of a partitioned topic's base name, shared by
//! its partitions, as Pulsar does), versioned 0, 1, 2, ... in the metadata store, and the
//! compatibility rules that decide whether a new schema may join them.
//!
//! [`SchemaHistory`] is the pure decision core (Pulsar's `SchemaRegistryServiceImpl` rules:
//! same type and data -> the existing version; otherwise a compatibility check against the
//! latest, or all for transitive strategies; delete = a tombstone version, and the history
//! before the last tombstone no longer counts). The broker's `SchemaRegistry` stores one
//! history per topic under one metadata key, updated by compare-and-set (the registry lives in the broker,
//! `magnetar_broker::schema_registry`; this module is the pure part).

mod avro;

pub use avro::{AvroParseError, AvroSchema};

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Schema types with the numbers of Pulsar's protobuf `Schema.Type` and the names of Java's
/// `SchemaType` (used by the REST API).
pub const SCHEMA_TYPES: [(i32, &str); 23] = [
    (0, "NONE"),
    (1, "STRING"),
    (2, "JSON"),
    (3, "PROTOBUF"),
    (4, "AVRO"),
    (5, "BOOLEAN"),
    (6, "INT8"),
    (7, "INT16"),
    (8, "INT32"),
    (9, "INT64"),
    (10, "FLOAT"),
    (11, "DOUBLE"),
    (12, "DATE"),
    (13, "TIME"),
    (14, "TIMESTAMP"),
    (15, "KEY_VALUE"),
    (16, "INSTANT"),
    (17, "LOCAL_DATE"),
    (18, "LOCAL_TIME"),
    (19, "LOCAL_DATE_TIME"),
    (20, "PROTOBUF_NATIVE"),
    (21, "AUTO_CONSUME"),
    (22, "EXTERNAL"),
];

/// Protobuf number of `JSON`, `AVRO` and `AUTO_CONSUME`.
pub const TYPE_JSON: i32 = 2;
pub const TYPE_AVRO: i32 = 4;
pub const TYPE_AUTO_CONSUME: i32 = 21;

/// The Java name of a schema type number (`"UNKNOWN"` for numbers we do not know).
pub fn type_name(code: i32) -> &'static str {
    SCHEMA_TYPES.iter().find(|(c, _)| *c == code).map_or("UNKNOWN", |(_, n)| n)
}

/// The type number of a Java schema type name.
pub fn type_code(name: &str) -> Option<i32> {
    SCHEMA_TYPES.iter().find(|(_, n)| *n == name).map(|(c, _)| *c)
}

/// Pulsar's `SchemaCompatibilityStrategy` (without `UNDEFINED`, which means "the broker
/// default", `FULL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompatibilityStrategy {
    AlwaysIncompatible,
    AlwaysCompatible,
    Backward,
    Forward,
    Full,
    BackwardTransitive,
    ForwardTransitive,
    FullTransitive,
}

impl CompatibilityStrategy {
    /// The broker default (`schemaCompatibilityStrategy=FULL`).
    pub const DEFAULT: CompatibilityStrategy = CompatibilityStrategy::Full;

    /// Parses a Java name; `UNDEFINED` and unknown names give the broker default.
    pub fn parse_or_default(name: &str) -> CompatibilityStrategy {
        use CompatibilityStrategy::*;
        match name {
            "ALWAYS_INCOMPATIBLE" => AlwaysIncompatible,
            "ALWAYS_COMPATIBLE" => AlwaysCompatible,
            "BACKWARD" => Backward,
            "FORWARD" => Forward,
            "FULL" => Full,
            "BACKWARD_TRANSITIVE" => BackwardTransitive,
            "FORWARD_TRANSITIVE" => ForwardTransitive,
            "FULL_TRANSITIVE" => FullTransitive,
            _ => Self::DEFAULT,
        }
    }

    pub fn name(self) -> &'static str {
        use CompatibilityStrategy::*;
        match self {
            AlwaysIncompatible => "ALWAYS_INCOMPATIBLE",
            AlwaysCompatible => "ALWAYS_COMPATIBLE",
            Backward => "BACKWARD",
            Forward => "FORWARD",
            Full => "FULL",
            BackwardTransitive => "BACKWARD_TRANSITIVE",
            ForwardTransitive => "FORWARD_TRANSITIVE",
            FullTransitive => "FULL_TRANSITIVE",
        }
    }

    fn is_transitive(self) -> bool {
        use CompatibilityStrategy::*;
        matches!(self, BackwardTransitive | ForwardTransitive | FullTransitive)
    }
}

/// The schema policies a topic obeys: its namespace's (`schema_compatibility_strategy`,
/// `is_allow_auto_update_schema`, `schema_validation_enforced`), with the topic's own
/// `schemaCompatibilityStrategy` over the namespace's. Absent fields take Pulsar's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchemaPolicies {
    pub strategy: CompatibilityStrategy,
    /// `is_allow_auto_update_schema`: producers may add new versions.
    pub allow_auto_update: bool,
    /// `schema_validation_enforced`: producers without a schema are refused on topics with one.
    pub validation_enforced: bool,
}

impl Default for SchemaPolicies {
    fn default() -> Self {
        SchemaPolicies {
            strategy: CompatibilityStrategy::DEFAULT,
            allow_auto_update: true,
            validation_enforced: false,
        }
    }
}

impl SchemaPolicies {
    /// Reads the fields from the stored namespace and topic documents (as JSON objects; an
    /// `UNDEFINED` topic strategy defers to the namespace's).
    pub fn from_documents(
        namespace: &serde_json::Map<String, serde_json::Value>,
        topic: &serde_json::Map<String, serde_json::Value>,
    ) -> SchemaPolicies {
        let text = |doc: &serde_json::Map<String, serde_json::Value>, field: &str| {
            doc.get(field).and_then(serde_json::Value::as_str).map(str::to_owned)
        };
        let flag = |field: &str| namespace.get(field).and_then(serde_json::Value::as_bool);
        let mut policies = SchemaPolicies::default();
        let strategy = text(topic, "schemaCompatibilityStrategy")
            .filter(|name| name != "UNDEFINED")
            .or_else(|| text(namespace, "schema_compatibility_strategy"));
        if let Some(name) = strategy {
            policies.strategy = CompatibilityStrategy::parse_or_default(&name);
        }
        if let Some(allow) = flag("is_allow_auto_update_schema") {
            policies.allow_auto_update = allow;
        }
        if let Some(enforced) = flag("schema_validation_enforced") {
            policies.validation_enforced = enforced;
        }
        policies
    }
}

/// Why a schema operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// The schema may not join the topic's schemas (Pulsar's `IncompatibleSchemaException`).
    #[error("{0}")]
    Incompatible(String),
    /// The schema definition is malformed (Pulsar's `InvalidSchemaDataException`).
    #[error("{0}")]
    Invalid(String),
    /// The metadata store failed, or holds a history we cannot decode.
    #[error("schema metadata: {0}")]
    Metadata(String),
}

/// A schema as a client or the REST API presents it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaData {
    /// Protobuf type number (see [`SCHEMA_TYPES`]).
    pub schema_type: i32,
    pub data: Vec<u8>,
    pub properties: BTreeMap<String, String>,
}

/// One stored version of a topic's schema.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredSchema {
    pub version: u64,
    #[serde(rename = "type")]
    pub schema_type: i32,
    /// The schema data, hex-encoded (it may be binary, e.g. protobuf descriptors).
    #[serde(with = "hex_bytes")]
    pub data: Vec<u8>,
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// Milliseconds since the epoch.
    pub timestamp: i64,
    /// A tombstone left by a delete.
    #[serde(default)]
    pub deleted: bool,
}

impl StoredSchema {
    fn same_schema(&self, candidate: &SchemaData) -> bool {
        !self.deleted && self.schema_type == candidate.schema_type && self.data == candidate.data
    }
}

/// All versions of one topic's schema, oldest first (the value of its metadata key).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchemaHistory {
    pub versions: Vec<StoredSchema>,
}

impl SchemaHistory {
    /// The versions that count: those after the last tombstone (Pulsar's
    /// `trimDeletedSchemaAndGetList`).
    pub fn live(&self) -> &[StoredSchema] {
        let start = self.versions.iter().rposition(|s| s.deleted).map_or(0, |i| i + 1);
        &self.versions[start..]
    }

    /// The newest version, unless it is a tombstone.
    pub fn latest(&self) -> Option<&StoredSchema> {
        self.versions.last().filter(|s| !s.deleted)
    }

    /// Any stored version (a tombstone included).
    pub fn get(&self, version: u64) -> Option<&StoredSchema> {
        self.versions.iter().find(|s| s.version == version)
    }

    /// A version that still counts: none before the last tombstone (what Pulsar serves to
    /// clients after a schema delete).
    pub fn get_live(&self, version: u64) -> Option<&StoredSchema> {
        self.live().iter().find(|s| s.version == version)
    }

    /// The live version holding exactly this schema.
    pub fn find(&self, candidate: &SchemaData) -> Option<u64> {
        self.live().iter().find(|s| s.same_schema(candidate)).map(|s| s.version)
    }

    fn next_version(&self) -> u64 {
        self.versions.last().map_or(0, |s| s.version + 1)
    }

    /// Whether `candidate` may be added under `strategy` (Pulsar's `checkCompatibleWith
    /// Latest` / `WithAll`): an existing identical schema always may.
    pub fn check(
        &self,
        candidate: &SchemaData,
        strategy: CompatibilityStrategy,
    ) -> Result<(), SchemaError> {
        if self.find(candidate).is_some() {
            return Ok(());
        }
        let live = self.live();
        let against: &[StoredSchema] = match (strategy.is_transitive(), live.last()) {
            (_, None) => return Ok(()),
            (true, Some(_)) => live,
            (false, Some(_)) => &live[live.len() - 1..],
        };
        for existing in against.iter().rev() {
            check_pair(existing, candidate, strategy)?;
        }
        Ok(())
    }

    /// Adds `candidate` unless an identical live version exists; returns its version and
    /// whether the history changed. Fails when it is incompatible.
    pub fn put_if_absent(
        &mut self,
        candidate: &SchemaData,
        strategy: CompatibilityStrategy,
        now_ms: i64,
    ) -> Result<(u64, bool), SchemaError> {
        if let Some(version) = self.find(candidate) {
            return Ok((version, false));
        }
        validate(candidate)?;
        self.check(candidate, strategy)?;
        let version = self.next_version();
        self.versions.push(StoredSchema {
            version,
            schema_type: candidate.schema_type,
            data: candidate.data.clone(),
            properties: candidate.properties.clone(),
            timestamp: now_ms,
            deleted: false,
        });
        Ok((version, true))
    }

    /// Whether a consumer with `candidate` may read this topic (Pulsar's
    /// `checkConsumerCompatibility`): the topic needs a schema, which the consumer's must be
    /// able to read (non-transitive strategies check `BACKWARD` against the latest).
    pub fn check_consumer(
        &self,
        candidate: &SchemaData,
        strategy: CompatibilityStrategy,
    ) -> Result<(), SchemaError> {
        use CompatibilityStrategy::*;
        if strategy == AlwaysCompatible {
            return Ok(());
        }
        if self.latest().is_none() {
            return Err(SchemaError::Incompatible("Topic does not have schema to check".into()));
        }
        match strategy {
            Backward | Forward | ForwardTransitive | Full => self.check(candidate, Backward),
            other => self.check(candidate, other),
        }
    }

    /// Appends a tombstone; returns its version, or `None` when there is no schema to delete.
    pub fn delete(&mut self, now_ms: i64) -> Option<u64> {
        self.latest()?;
        let version = self.next_version();
        self.versions.push(StoredSchema {
            version,
            schema_type: 0,
            data: Vec::new(),
            properties: BTreeMap::new(),
            timestamp: now_ms,
            deleted: true,
        });
        Some(version)
    }
}

/// AVRO and JSON definitions must be Avro schemas (the Python, C++, Go and Java clients all
/// send JSON schemas as Avro definitions); other types carry free-form data.
fn validate(candidate: &SchemaData) -> Result<(), SchemaError> {
    if matches!(candidate.schema_type, TYPE_AVRO | TYPE_JSON) {
        AvroSchema::parse(&candidate.data).map_err(|e| SchemaError::Invalid(e.to_string()))?;
    }
    Ok(())
}

/// One existing schema against a candidate (Pulsar's `checkCompatible`): different types
/// never mix; for Avro-based types the strategy decides through Avro's resolution rules; other
/// types are compatible unless the strategy is `ALWAYS_INCOMPATIBLE`.
fn check_pair(
    existing: &StoredSchema,
    candidate: &SchemaData,
    strategy: CompatibilityStrategy,
) -> Result<(), SchemaError> {
    use CompatibilityStrategy::*;
    // Pulsar answers ALWAYS_COMPATIBLE before it compares types: a type change is allowed.
    if strategy == AlwaysCompatible {
        return Ok(());
    }
    if existing.schema_type != candidate.schema_type {
        return Err(SchemaError::Incompatible(format!(
            "Incompatible schema: exists schema type {}, new schema type {}",
            type_name(existing.schema_type),
            type_name(candidate.schema_type)
        )));
    }
    if existing.data == candidate.data {
        return Ok(());
    }
    if strategy == AlwaysIncompatible {
        return Err(SchemaError::Incompatible(
            "Schema compatibility strategy is ALWAYS_INCOMPATIBLE".into(),
        ));
    }
    if !matches!(candidate.schema_type, TYPE_AVRO | TYPE_JSON) {
        return Ok(());
    }
    let incompatible =
        |why: String| SchemaError::Incompatible(format!("{why} ({})", strategy.name()));
    let old = AvroSchema::parse(&existing.data).map_err(|e| incompatible(e.to_string()))?;
    let new = AvroSchema::parse(&candidate.data).map_err(|e| incompatible(e.to_string()))?;
    // Backward: the new schema reads data written with the old; forward: the reverse.
    if matches!(strategy, Backward | BackwardTransitive | Full | FullTransitive) {
        new.can_read(&old)
            .map_err(|why| incompatible(format!("new schema cannot read old data: {why}")))?;
    }
    if matches!(strategy, Forward | ForwardTransitive | Full | FullTransitive) {
        old.can_read(&new)
            .map_err(|why| incompatible(format!("old schema cannot read new data: {why}")))?;
    }
    Ok(())
}

/// Hex encoding of the stored schema data.
mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        serializer.serialize_str(&hex)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let hex = String::deserialize(deserializer)?;
        if hex.len() % 2 != 0 {
            return Err(serde::de::Error::custom("odd hex length"));
        }
        (0..hex.len())
            .step_by(2)
            .map(|i| {
                hex.get(i..i + 2)
                    .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                    .ok_or_else(|| serde::de::Error::custom("bad hex digit"))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn avro(fields: &str) -> SchemaData {
        SchemaData {
            schema_type: TYPE_AVRO,
            data: format!(r#"{{"type":"record","name":"User","fields":[{fields}]}}"#).into_bytes(),
            properties: BTreeMap::new(),
        }
    }

    const NAME: &str = r#"{"name":"name","type":["null","string"]}"#;
    const AGE: &str = r#"{"name":"age","type":["null","int"]}"#;
    const EMAIL_DEFAULT: &str = r#"{"name":"email","type":["null","string"],"default":null}"#;
    const EMAIL: &str = r#"{"name":"email","type":["null","string"]}"#;

    #[test]
    fn same_schema_keeps_its_version_and_evolution_gets_the_next() {
        let mut history = SchemaHistory::default();
        let v1 = avro(&format!("{NAME},{AGE}"));
        assert_eq!(history.put_if_absent(&v1, CompatibilityStrategy::Full, 1), Ok((0, true)));
        assert_eq!(history.put_if_absent(&v1, CompatibilityStrategy::Full, 2), Ok((0, false)));
        let v2 = avro(&format!("{NAME},{AGE},{EMAIL_DEFAULT}"));
        assert_eq!(history.put_if_absent(&v2, CompatibilityStrategy::Full, 3), Ok((1, true)));
        // The older schema is still a known version.
        assert_eq!(history.put_if_absent(&v1, CompatibilityStrategy::Full, 4), Ok((0, false)));
        assert_eq!(history.latest().map(|s| s.version), Some(1));
    }

    #[test]
    fn full_refuses_fields_without_defaults_and_type_changes() {
        let mut history = SchemaHistory::default();
        history
            .put_if_absent(&avro(&format!("{NAME},{AGE}")), CompatibilityStrategy::Full, 1)
            .unwrap();
        let added = avro(&format!("{NAME},{AGE},{EMAIL}"));
        assert_eq!(
            history.put_if_absent(&added, CompatibilityStrategy::Full, 2),
            Err(SchemaError::Incompatible(
                "new schema cannot read old data: /email: field email is missing in the \
                 writer's schema and has no default (FULL)"
                    .into()
            ))
        );
        // Removing a field without a default breaks forward compatibility.
        let removed = avro(NAME);
        assert_eq!(
            history.check(&removed, CompatibilityStrategy::Full).unwrap_err().to_string(),
            "old schema cannot read new data: /age: field age is missing in the writer's \
             schema and has no default (FULL)"
        );
        assert!(history.check(&removed, CompatibilityStrategy::Backward).is_ok());
        let changed = avro(&format!("{NAME},{}", r#"{"name":"age","type":"string"}"#));
        let why = history.check(&changed, CompatibilityStrategy::Full).unwrap_err().to_string();
        assert!(
            why.starts_with("new schema cannot read old data: /age: string cannot read"),
            "{why}"
        );
        assert!(history.check(&changed, CompatibilityStrategy::AlwaysCompatible).is_ok());
        assert_eq!(history.versions.len(), 1, "refused schemas leave no version");
    }

    #[test]
    fn different_types_mix_only_under_always_compatible() {
        let mut history = SchemaHistory::default();
        history.put_if_absent(&avro(NAME), CompatibilityStrategy::Full, 1).unwrap();
        let json = SchemaData { schema_type: TYPE_JSON, ..avro(NAME) };
        let err = history.check(&json, CompatibilityStrategy::Full).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Incompatible schema: exists schema type AVRO, new schema type JSON"
        );
        assert!(history.check(&json, CompatibilityStrategy::AlwaysCompatible).is_ok());
    }

    #[test]
    fn transitive_strategies_check_every_live_version() {
        let mut history = SchemaHistory::default();
        let s = CompatibilityStrategy::Backward;
        // v0 {name}, v1 {name, age?=default}, then v2 {name, age (no default)}:
        // v2 reads v1 data (age present) but not v0 data (age missing, no default).
        history.put_if_absent(&avro(NAME), s, 1).unwrap();
        let age_default = r#"{"name":"age","type":["null","int"],"default":null}"#;
        history.put_if_absent(&avro(&format!("{NAME},{age_default}")), s, 2).unwrap();
        let strict = avro(&format!("{NAME},{AGE}"));
        assert!(history.check(&strict, CompatibilityStrategy::Backward).is_ok());
        let why = history.check(&strict, CompatibilityStrategy::BackwardTransitive).unwrap_err();
        assert_eq!(
            why.to_string(),
            "new schema cannot read old data: /age: field age is missing in the writer's schema \
             and has no default (BACKWARD_TRANSITIVE)"
        );
    }

    #[test]
    fn delete_leaves_a_tombstone_and_starts_a_fresh_history() {
        let mut history = SchemaHistory::default();
        history.put_if_absent(&avro(NAME), CompatibilityStrategy::Full, 1).unwrap();
        assert_eq!(history.delete(2), Some(1));
        assert_eq!(history.delete(3), None, "nothing left to delete");
        assert!(history.latest().is_none());
        assert!(history.live().is_empty());
        assert!(history.get(0).is_some(), "kept in the history");
        assert!(history.get_live(0).is_none(), "but no longer served");
        // After the delete, anything goes (nothing live to be compatible with).
        let json = SchemaData { schema_type: TYPE_JSON, ..avro(AGE) };
        assert_eq!(history.put_if_absent(&json, CompatibilityStrategy::Full, 4), Ok((2, true)));
        assert!(history.get(0).is_some_and(|s| !s.deleted));
    }

    #[test]
    fn consumers_need_a_schema_they_can_read() {
        let mut history = SchemaHistory::default();
        let v1 = avro(&format!("{NAME},{AGE}"));
        let err = history.check_consumer(&v1, CompatibilityStrategy::Full).unwrap_err();
        assert_eq!(err, SchemaError::Incompatible("Topic does not have schema to check".into()));
        history.put_if_absent(&v1, CompatibilityStrategy::Full, 1).unwrap();
        // A reader without `age` can read; one needing `email` without default cannot.
        assert!(history.check_consumer(&avro(NAME), CompatibilityStrategy::Full).is_ok());
        let needs_email = avro(&format!("{NAME},{EMAIL}"));
        let why = history.check_consumer(&needs_email, CompatibilityStrategy::Full).unwrap_err();
        assert!(why.to_string().contains("field email is missing"), "{why}");
        // FORWARD_TRANSITIVE checks a consumer against the latest only, as FULL does.
        let why = history.check_consumer(&needs_email, CompatibilityStrategy::ForwardTransitive);
        assert!(why.unwrap_err().to_string().contains("(BACKWARD)"));
    }

    #[test]
    fn invalid_avro_is_refused_and_other_types_are_free_form() {
        let mut history = SchemaHistory::default();
        let bad = SchemaData { data: b"{nope".to_vec(), ..avro(NAME) };
        assert!(matches!(
            history.put_if_absent(&bad, CompatibilityStrategy::Full, 1),
            Err(SchemaError::Invalid(_))
        ));
        let string = SchemaData { schema_type: 1, data: vec![], properties: BTreeMap::new() };
        assert_eq!(history.put_if_absent(&string, CompatibilityStrategy::Full, 1), Ok((0, true)));
    }

    #[test]
    fn history_round_trips_through_json() {
        let mut history = SchemaHistory::default();
        let mut data = avro(NAME);
        data.properties.insert("k".into(), "v".into());
        history.put_if_absent(&data, CompatibilityStrategy::Full, 7).unwrap();
        history.delete(8);
        let json = serde_json::to_vec(&history).unwrap();
        let back: SchemaHistory = serde_json::from_slice(&json).unwrap();
        assert_eq!(back, history);
        assert!(serde_json::from_str::<SchemaHistory>(
            r#"{"versions":[{"version":0,"type":4,"data":"zz","timestamp":0}]}"#
        )
        .is_err());
    }

    #[test]
    fn type_names_match_java() {
        assert_eq!(type_name(TYPE_AVRO), "AVRO");
        assert_eq!(type_code("JSON"), Some(TYPE_JSON));
        assert_eq!(type_code("BYTES"), None);
        assert_eq!(
            CompatibilityStrategy::parse_or_default("UNDEFINED"),
            CompatibilityStrategy::Full
        );
    }
}
