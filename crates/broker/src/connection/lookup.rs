//! Discovery: PARTITIONED_METADATA, LOOKUP (through the broker's `Ownership`), topics of a namespace.

use super::*;

impl Connection {
    pub(super) async fn on_partitioned_metadata(&mut self, command: &BaseCommand) -> Handled {
        let request =
            command.partition_metadata.as_ref().ok_or("PARTITIONED_METADATA without body")?;
        let request_id = request.request_id;
        let result = async {
            let name = BrokerService::topic_name(&request.topic)?;
            let principal = self.principal.as_ref();
            let lookup = TopicOperation::Lookup;
            authz::authorize_topic(&self.service, principal, &request.topic, lookup, None).await?;
            if !self.service.is_loaded(&name) {
                // A topic this broker would have to load: answer at once, with an error clients
                // retry, while its metadata session is lost (instead of waiting on the store).
                self.service.readiness.check()?;
            }
            let partitions = self.service.partitions(&name).await?;
            let may_create = request.metadata_auto_creation_enabled.unwrap_or(true)
                && self.service.allow_auto_topic_creation();
            if partitions == 0 && !may_create && !self.service.topic_exists(&name).await? {
                return Err(BrokerError::TopicNotFound(name.to_string()));
            }
            Ok(partitions)
        }
        .await;
        let reply = match result {
            Ok(partitions) => commands::partitioned_metadata_response(request_id, partitions),
            Err(error) => commands::partitioned_metadata_failed(
                request_id,
                error.server_error(),
                error.to_string(),
            ),
        };
        self.outbox.send_command(&reply);
        Ok(())
    }

    /// LOOKUP: answered by the broker's [`crate::ownership::Ownership`], from a task of its own
    /// (a cluster's answer may take a metadata round trip).
    pub(super) fn on_lookup(&mut self, command: &BaseCommand) -> Handled {
        let request = command.lookup_topic.as_ref().ok_or("LOOKUP without body")?;
        let (request_id, authoritative) = (request.request_id, request.authoritative());
        let topic = request.topic.clone();
        let listener = request.advertised_listener_name.clone();
        let (service, outbox) = (self.service.clone(), self.outbox.clone());
        let principal = self.principal.clone();
        tokio::spawn(async move {
            let lookup = TopicOperation::Lookup;
            let allowed =
                authz::authorize_topic(&service, principal.as_ref(), &topic, lookup, None).await;
            let answer = match (allowed, BrokerService::topic_name(&topic)) {
                (Err(error), _) | (_, Err(error)) => Err(error),
                (Ok(()), Ok(name)) => service.ownership.lookup(&name, authoritative).await,
            };
            let answer = answer.and_then(|answer| {
                answer.for_listener(listener.as_deref()).map_err(BrokerError::ServiceNotReady)
            });
            let reply = match answer {
                Ok(LookupAnswer::Connect { urls }) => commands::lookup_response(
                    request_id,
                    LookupType::Connect,
                    urls.broker_url,
                    urls.broker_url_tls,
                    true,
                    false,
                ),
                Ok(LookupAnswer::Redirect { urls, authoritative }) => commands::lookup_response(
                    request_id,
                    LookupType::Redirect,
                    urls.broker_url,
                    urls.broker_url_tls,
                    authoritative,
                    false,
                ),
                Err(error) => {
                    commands::lookup_failed(request_id, error.server_error(), error.to_string())
                }
            };
            outbox.send_command(&reply);
        });
        Ok(())
    }

    /// GET_TOPICS_OF_NAMESPACE: the namespace's topics in the requested domains, filtered by the
    /// optional pattern, with their hash (the list is left out when the client's hash matches),
    /// as Pulsar's `ServerCnx.handleGetTopicsOfNamespace`.
    pub(super) async fn on_get_topics_of_namespace(&mut self, command: &BaseCommand) -> Handled {
        use magnetar_model::names::NamespaceName;
        use magnetar_protocol::proto::command_get_topics_of_namespace::Mode;
        let request = command
            .get_topics_of_namespace
            .as_ref()
            .ok_or("GET_TOPICS_OF_NAMESPACE without body")?;
        let request_id = request.request_id;
        let Ok(ns) = NamespaceName::parse(&request.namespace) else {
            let error = BrokerError::InvalidRequest(format!(
                "invalid namespace name '{}'",
                request.namespace
            ));
            self.reply_error(request_id, &error);
            return Ok(());
        };
        let domains: &[TopicDomain] =
            match request.mode.and_then(|m| Mode::try_from(m).ok()).unwrap_or(Mode::Persistent) {
                Mode::Persistent => &[TopicDomain::Persistent],
                Mode::NonPersistent => &[TopicDomain::NonPersistent],
                Mode::All => &TopicDomain::ALL,
            };
        let principal = self.principal.as_ref();
        let get_topics = NamespaceOperation::GetTopics;
        if let Err(error) =
            authz::authorize_namespace(&self.service, principal, &ns, get_topics).await
        {
            self.reply_error(request_id, &error);
            return Ok(());
        }
        let topics = match self.service.topics_of_namespace(&ns, domains).await {
            Ok(topics) => topics,
            Err(error) => {
                self.reply_error(request_id, &error);
                return Ok(());
            }
        };
        let (topics, filtered) = match request.topics_pattern.as_deref() {
            Some(pattern) => match crate::service::filter_topics(&topics, pattern) {
                Some(matched) => (matched, true),
                None => (topics, false),
            },
            None => (topics, false),
        };
        let hash = crate::service::topics_hash(&topics);
        let unchanged = request.topics_hash.as_deref() == Some(hash.as_str());
        let reply = commands::get_topics_of_namespace_response(
            request_id,
            (!unchanged).then_some(topics),
            filtered,
            hash,
        );
        self.outbox.send_command(&reply);
        Ok(())
    }
}
