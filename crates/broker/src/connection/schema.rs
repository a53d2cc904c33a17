//! GET_SCHEMA, GET_OR_CREATE_SCHEMA, and the schema checks of producers and consumers.

use super::*;
use crate::schema_registry::SchemaPolicies;

impl Connection {
    /// GET_SCHEMA: the topic's schema at the requested version (latest when none is given).
    pub(super) async fn on_get_schema(&mut self, command: &BaseCommand) -> Handled {
        let request = command.get_schema.as_ref().ok_or("GET_SCHEMA without body")?;
        let request_id = request.request_id;
        let not_found = || {
            commands::get_schema_error(
                request_id,
                ServerError::TopicNotFound,
                format!("Topic not found or no-schema {}", request.topic),
            )
        };
        let name = match BrokerService::topic_name(&request.topic) {
            Ok(name) => name,
            Err(error) => {
                let reply =
                    commands::get_schema_error(request_id, error.server_error(), error.to_string());
                self.outbox.send_command(&reply);
                return Ok(());
            }
        };
        let principal = self.principal.as_ref();
        let lookup = TopicOperation::Lookup;
        if let Err(error) =
            authz::authorize_topic(&self.service, principal, &request.topic, lookup, None).await
        {
            let reply =
                commands::get_schema_error(request_id, error.server_error(), error.to_string());
            self.outbox.send_command(&reply);
            return Ok(());
        }
        let reply = match self.service.schemas.history(&name).await {
            Err(error) => {
                let error = BrokerError::from(error);
                commands::get_schema_error(request_id, error.server_error(), error.to_string())
            }
            Ok((history, _)) => {
                let wanted = match request.schema_version.as_deref() {
                    None | Some([]) => history.versions.last(),
                    Some(bytes) => {
                        commands::parse_schema_version(bytes).and_then(|v| history.get_live(v))
                    }
                };
                match wanted.filter(|s| !s.deleted) {
                    None => not_found(),
                    Some(stored) => {
                        let base = name.partitioned_topic();
                        let schema = Schema {
                            name: format!(
                                "{}/{}/{}",
                                base.tenant(),
                                base.namespace().namespace(),
                                base.local_name()
                            ),
                            schema_data: stored.data.clone().into(),
                            r#type: stored.schema_type,
                            properties: stored
                                .properties
                                .iter()
                                .map(|(key, value)| magnetar_protocol::proto::KeyValue {
                                    key: key.clone(),
                                    value: value.clone(),
                                })
                                .collect(),
                        };
                        commands::get_schema_response(request_id, schema, stored.version)
                    }
                }
            }
        };
        self.outbox.send_command(&reply);
        Ok(())
    }

    /// GET_OR_CREATE_SCHEMA: the version of the schema on an existing topic, registered as a
    /// producer's would be.
    pub(super) async fn on_get_or_create_schema(&mut self, command: &BaseCommand) -> Handled {
        let request =
            command.get_or_create_schema.as_ref().ok_or("GET_OR_CREATE_SCHEMA without body")?;
        let result = async {
            let name = BrokerService::topic_name(&request.topic)?;
            let (principal, produce) = (self.principal.as_ref(), TopicOperation::Produce);
            authz::authorize_topic(&self.service, principal, &request.topic, produce, None).await?;
            let policies = if name.domain() == TopicDomain::NonPersistent {
                self.service.non_persistent_topic_with_policies(&name, false).await?.1.schema
            } else {
                let topic = self.service.topic(&name, false).await?;
                topic.refresh_policies().await?;
                topic.policies().schema
            };
            let version =
                producer_schema(&self.service, &name, Some(&request.schema), policies).await?;
            Ok::<_, BrokerError>(version.unwrap_or(0))
        }
        .await;
        let result = result.map_err(|error| (error.server_error(), error.to_string()));
        let reply = commands::get_or_create_schema_response(request.request_id, result);
        self.outbox.send_command(&reply);
        Ok(())
    }
}

/// The schema version a producer gets (Pulsar's `tryAddSchema`): its schema registered
/// (or found) when it has one; without one, nothing, unless the namespace enforces schema
/// validation and the topic has a schema. `policies` are the topic's, freshly read.
pub(super) async fn producer_schema(
    service: &BrokerService,
    topic: &TopicName,
    schema: Option<&Schema>,
    policies: SchemaPolicies,
) -> Result<Option<u64>, BrokerError> {
    let registry = &service.schemas;
    match schema {
        Some(schema) => {
            Ok(Some(registry.put_if_absent(topic, &schema_data(schema), policies).await?))
        }
        None if policies.validation_enforced => {
            if registry.history(topic).await?.0.latest().is_some() {
                return Err(BrokerError::IncompatibleSchema(
                    "Producers cannot connect without a schema to topics with a schema \
                     when schema validation is enforced"
                        .into(),
                ));
            }
            Ok(None)
        }
        None => Ok(None),
    }
}

/// A consumer's schema (Pulsar's `addSchemaIfIdleOrCheckCompatible`): it becomes the
/// topic's schema when the topic has none and is idle (no producer, consumer or data);
/// otherwise it must be able to read the topic's schema.
pub(super) async fn consumer_schema(
    service: &BrokerService,
    name: &TopicName,
    topic_is_idle: bool,
    policies: SchemaPolicies,
    schema: &Schema,
) -> Result<(), BrokerError> {
    let registry = &service.schemas;
    let data = schema_data(schema);
    let (history, _) = registry.history(name).await?;
    if history.latest().is_some() || !topic_is_idle {
        history.check_consumer(&data, policies.strategy)?;
    } else {
        registry.put_if_absent(name, &data, policies).await?;
    }
    Ok(())
}

/// A schema as the registry sees it.
pub(super) fn schema_data(schema: &Schema) -> SchemaData {
    SchemaData {
        schema_type: schema.r#type,
        data: schema.schema_data.to_vec(),
        properties: schema.properties.iter().map(|kv| (kv.key.clone(), kv.value.clone())).collect(),
    }
}
