//! [`SchemaRegistry`]: schema histories in the metadata store, one key per topic, updated by
//! compare-and-set so that concurrent registrations (two producers, or a producer and the
//! REST API) never lose a version.

use crate::clock::{Clock, SystemClock};
use bytes::Bytes;
use magnetar_metadata::{ExpectedVersion, MetadataError, MetadataStore};
use magnetar_model::keys;
use magnetar_model::names::TopicName;
use magnetar_model::schema::{SchemaData, SchemaError, SchemaHistory};
use serde_json::Value;
use std::sync::Arc;

pub use magnetar_model::keys::{schema_key, SCHEMAS_ROOT};

/// Bounded compare-and-set retries: contention on one topic's schema is rare and short.
const MAX_CAS_ATTEMPTS: usize = 64;

fn metadata_error(error: MetadataError) -> SchemaError {
    SchemaError::Metadata(error.to_string())
}

pub use magnetar_model::schema::SchemaPolicies;

#[derive(Clone)]
pub struct SchemaRegistry {
    store: Arc<dyn MetadataStore>,
    clock: Arc<dyn Clock>,
}

impl SchemaRegistry {
    /// A registry stamping versions with the system clock.
    pub fn new(store: Arc<dyn MetadataStore>) -> Self {
        SchemaRegistry::with_clock(store, Arc::new(SystemClock))
    }

    pub fn with_clock(store: Arc<dyn MetadataStore>, clock: Arc<dyn Clock>) -> Self {
        SchemaRegistry { store, clock }
    }

    fn now_ms(&self) -> i64 {
        i64::try_from(self.clock.now_ms()).unwrap_or(i64::MAX)
    }

    /// The topic's history and the version of its metadata key (`None`: no key).
    pub async fn history(
        &self,
        topic: &TopicName,
    ) -> Result<(SchemaHistory, Option<u64>), SchemaError> {
        let key = schema_key(topic);
        match self.store.get(&key).await.map_err(metadata_error)? {
            None => Ok((SchemaHistory::default(), None)),
            Some(found) => {
                let history = serde_json::from_slice(&found.value)
                    .map_err(|e| SchemaError::Metadata(format!("corrupt schema at {key}: {e}")))?;
                Ok((history, Some(found.version)))
            }
        }
    }

    /// Applies `change` to the topic's history and stores the result if `change` says it
    /// changed, retrying on concurrent updates. Returns what `change` returned.
    async fn update<T>(
        &self,
        topic: &TopicName,
        mut change: impl FnMut(&mut SchemaHistory) -> Result<(T, bool), SchemaError>,
    ) -> Result<T, SchemaError> {
        let key = schema_key(topic);
        for _ in 0..MAX_CAS_ATTEMPTS {
            let (mut history, version) = self.history(topic).await?;
            let (out, changed) = change(&mut history)?;
            if !changed {
                return Ok(out);
            }
            let value = serde_json::to_vec(&history)
                .map_err(|e| SchemaError::Metadata(format!("cannot encode schema: {e}")))?;
            let expected = version.map_or(ExpectedVersion::Absent, ExpectedVersion::Exactly);
            match self.store.put(&key, Bytes::from(value), expected).await {
                Ok(_) => return Ok(out),
                Err(e) if e.is_bad_version() => continue,
                Err(e) => return Err(metadata_error(e)),
            }
        }
        Err(SchemaError::Metadata(format!("too much contention on {key}")))
    }

    /// Pulsar's `putSchemaIfAbsent` (with `isAllowAutoUpdateSchema` honoured): the version of
    /// `schema`, added if needed and allowed.
    pub async fn put_if_absent(
        &self,
        topic: &TopicName,
        schema: &SchemaData,
        policies: SchemaPolicies,
    ) -> Result<u64, SchemaError> {
        let now = self.now_ms();
        self.update(topic, |history| {
            if !policies.allow_auto_update {
                return match history.find(schema) {
                    Some(version) => Ok((version, false)),
                    None => Err(SchemaError::Incompatible(
                        "Schema not found and schema auto updating is disabled.".into(),
                    )),
                };
            }
            history.put_if_absent(schema, policies.strategy, now)
        })
        .await
    }

    /// Appends a tombstone (or, with `force`, removes every version). Returns the tombstone's
    /// version, `None` when there was nothing to delete.
    pub async fn delete(&self, topic: &TopicName, force: bool) -> Result<Option<u64>, SchemaError> {
        if force {
            let (history, version) = self.history(topic).await?;
            let last = history.latest().map(|s| s.version);
            if let Some(version) = version {
                match self.store.delete(&schema_key(topic), ExpectedVersion::Exactly(version)).await
                {
                    Ok(()) => {}
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(metadata_error(e)),
                }
            }
            return Ok(last);
        }
        let now = self.now_ms();
        self.update(topic, |history| {
            let deleted = history.delete(now);
            Ok((deleted, deleted.is_some()))
        })
        .await
    }

    /// The schema policies of the topic as its stored namespace and topic documents give them
    /// (for the admin API, which has no loaded topic; a loaded topic carries them in its
    /// `Effective` policies).
    pub async fn policies(&self, topic: &TopicName) -> Result<SchemaPolicies, SchemaError> {
        let namespace_key = keys::namespace_key(topic.namespace());
        let topic_key = keys::topic_policies_key(&topic.partitioned_topic());
        let namespace = self.stored_object(&namespace_key).await?.unwrap_or_default();
        let own = self.stored_object(&topic_key).await?.unwrap_or_default();
        Ok(SchemaPolicies::from_documents(&namespace, &own))
    }

    /// The JSON object stored at `key`, if any (an unreadable one is the admin API's to report;
    /// schemas fall back to defaults).
    async fn stored_object(
        &self,
        key: &str,
    ) -> Result<Option<serde_json::Map<String, Value>>, SchemaError> {
        let Some(found) = self.store.get(key).await.map_err(metadata_error)? else {
            return Ok(None);
        };
        match serde_json::from_slice::<Value>(&found.value) {
            Ok(Value::Object(stored)) => Ok(Some(stored)),
            _ => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use magnetar_metadata::MemoryStore;
    use magnetar_model::schema::CompatibilityStrategy;
    use magnetar_model::schema::TYPE_AVRO;
    use std::collections::BTreeMap;

    fn record(fields: &str) -> SchemaData {
        SchemaData {
            schema_type: TYPE_AVRO,
            data: format!(r#"{{"type":"record","name":"R","fields":[{fields}]}}"#).into_bytes(),
            properties: BTreeMap::new(),
        }
    }

    fn run<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().build().expect("runtime").block_on(f)
    }

    #[test]
    fn partitions_share_their_topics_schema_key() {
        let topic = TopicName::parse("persistent://t/ns/a b").unwrap();
        assert_eq!(schema_key(&topic), "/schemas/t/ns/a+b");
        assert_eq!(schema_key(&topic.partition(3)), schema_key(&topic));
        let np = TopicName::parse("non-persistent://t/ns/a b").unwrap();
        assert_eq!(schema_key(&np), schema_key(&topic));
    }

    #[test]
    fn versions_are_stored_and_reused() {
        run(async {
            let store: Arc<dyn MetadataStore> = Arc::new(MemoryStore::new());
            let registry = SchemaRegistry::new(store.clone());
            let topic = TopicName::parse("persistent://t/ns/x").unwrap();
            let policies = SchemaPolicies::default();
            let v1 = record(r#"{"name":"a","type":"int"}"#);
            let v2 = record(r#"{"name":"a","type":"int"},{"name":"b","type":"int","default":1}"#);
            assert_eq!(registry.put_if_absent(&topic, &v1, policies).await, Ok(0));
            assert_eq!(registry.put_if_absent(&topic.partition(1), &v1, policies).await, Ok(0));
            assert_eq!(registry.put_if_absent(&topic, &v2, policies).await, Ok(1));
            let bad = record(r#"{"name":"a","type":"string"}"#);
            assert!(matches!(
                registry.put_if_absent(&topic, &bad, policies).await,
                Err(SchemaError::Incompatible(_))
            ));
            // A second registry over the same store (a restart) sees the same history.
            let (history, _) = SchemaRegistry::new(store).history(&topic).await.unwrap();
            assert_eq!(history.versions.len(), 2);
            // Auto update off: known schemas pass, new ones are refused.
            let frozen = SchemaPolicies { allow_auto_update: false, ..policies };
            assert_eq!(registry.put_if_absent(&topic, &v1, frozen).await, Ok(0));
            let v3 = record(r#"{"name":"a","type":"int"},{"name":"c","type":"int","default":1}"#);
            assert!(registry.put_if_absent(&topic, &v3, frozen).await.is_err());
        });
    }

    #[test]
    fn delete_and_force_delete() {
        run(async {
            let registry = SchemaRegistry::new(Arc::new(MemoryStore::new()));
            let topic = TopicName::parse("persistent://t/ns/d").unwrap();
            let policies = SchemaPolicies::default();
            assert_eq!(registry.delete(&topic, false).await, Ok(None));
            registry
                .put_if_absent(&topic, &record(r#"{"name":"a","type":"int"}"#), policies)
                .await
                .unwrap();
            assert_eq!(registry.delete(&topic, false).await, Ok(Some(1)));
            let (history, _) = registry.history(&topic).await.unwrap();
            assert!(history.latest().is_none());
            let other = record(r#"{"name":"z","type":"string"}"#);
            assert_eq!(registry.put_if_absent(&topic, &other, policies).await, Ok(2));
            assert_eq!(registry.delete(&topic, true).await, Ok(Some(2)));
            let (history, version) = registry.history(&topic).await.unwrap();
            assert!(history.versions.is_empty() && version.is_none());
        });
    }

    #[test]
    fn namespace_policies_are_read() {
        run(async {
            let store: Arc<dyn MetadataStore> = Arc::new(MemoryStore::new());
            let topic = TopicName::parse("persistent://t/ns/p").unwrap();
            let registry = SchemaRegistry::new(store.clone());
            assert_eq!(registry.policies(&topic).await, Ok(SchemaPolicies::default()));
            let policies = br#"{"schema_compatibility_strategy":"BACKWARD","is_allow_auto_update_schema":false}"#;
            store
                .put("/admin/namespaces/t/ns", Bytes::from_static(policies), ExpectedVersion::Any)
                .await
                .unwrap();
            let read = registry.policies(&topic).await.unwrap();
            assert_eq!(read.strategy, CompatibilityStrategy::Backward);
            assert!(!read.allow_auto_update && !read.validation_enforced);
            // The topic's own strategy wins over the namespace's; UNDEFINED defers to it.
            let key = keys::topic_policies_key(&topic.partitioned_topic());
            let own = br#"{"schemaCompatibilityStrategy":"FORWARD_TRANSITIVE"}"#;
            store.put(&key, Bytes::from_static(own), ExpectedVersion::Any).await.unwrap();
            let read = registry.policies(&topic).await.unwrap();
            assert_eq!(read.strategy, CompatibilityStrategy::ForwardTransitive);
            assert!(!read.allow_auto_update, "the rest is the namespace's");
            let undefined = br#"{"schemaCompatibilityStrategy":"UNDEFINED"}"#;
            store.put(&key, Bytes::from_static(undefined), ExpectedVersion::Any).await.unwrap();
            assert_eq!(
                registry.policies(&topic).await.unwrap().strategy,
                CompatibilityStrategy::Backward
            );
        });
    }
}
