//! SUBSCRIBE and everything a consumer sends: flow, acks, redelivery, seek, unsubscribe, close.

use super::*;

impl Connection {
    /// SUBSCRIBE: served from a task of its own, like PRODUCER; the consumer joins the
    /// connection, hears SUCCESS, and only then its first ACTIVE_CONSUMER_CHANGE (clients
    /// ignore events for a consumer they have not been told exists).
    pub(super) fn on_subscribe(&mut self, command: &BaseCommand) -> Handled {
        let request = command.subscribe.as_ref().ok_or("SUBSCRIBE without body")?;
        let (request_id, consumer_id) = (request.request_id, request.consumer_id);
        if let Some(existing) = self.consumers.get(&consumer_id) {
            if existing.subscription.has_consumer(existing.key) {
                self.outbox.send_command(&commands::success(request_id));
                return Ok(());
            }
            // Detached by the broker (seek): the client subscribes again under the same id.
            self.consumers.remove(&consumer_id);
        }
        if let Some(existing) = self.np_consumers.get(&consumer_id) {
            if existing.subscription.has_consumer(existing.key) {
                self.outbox.send_command(&commands::success(request_id));
                return Ok(());
            }
            // Detached by the broker (the topic was unloaded): subscribes again.
            self.np_consumers.remove(&consumer_id);
        }
        if self.pending_consumers.contains_key(&consumer_id) {
            let error = BrokerError::ServiceNotReady(
                "Consumer is already present on the connection".into(),
            );
            self.reply_error(request_id, &error);
            return Ok(());
        }
        let request = (**request).clone();
        let (service, outbox) = (self.service.clone(), self.outbox.clone());
        let info = self.client_info(&request.metadata);
        let principal = self.principal.clone();
        let changes_before = self.permission_changes_seen;
        let task = self.spawn_request(async move {
            let subscription = Some(request.subscription.as_str());
            let allowed = authz::authorize_topic(
                &service,
                principal.as_ref(),
                &request.topic,
                TopicOperation::Consume,
                subscription,
            )
            .await;
            let created = match allowed {
                Ok(()) => create_consumer(&service, &outbox, &request, info).await,
                Err(error) => Err(error),
            };
            let finish: Completion = Box::new(move |connection: &mut Connection| {
                connection.open_checked(changes_before, |c| c.consumer_created(&request, created))
            });
            finish
        });
        self.pending_consumers.insert(consumer_id, task);
        Ok(())
    }

    pub(super) fn consumer_created(
        &mut self,
        request: &CommandSubscribe,
        created: Result<CreatedConsumer, BrokerError>,
    ) {
        let (request_id, consumer_id) = (request.request_id, request.consumer_id);
        let still_wanted = self.pending_consumers.remove(&consumer_id).is_some();
        match created {
            Ok(created) if !still_wanted => {
                tokio::spawn(created.release());
            }
            Err(_) if !still_wanted => {}
            Err(error) => self.reply_error(request_id, &error),
            Ok(CreatedConsumer::NonPersistent(context)) => {
                tracing::info!(peer = %self.peer, client = %self.client_version,
                    topic = %context.topic.name, subscription = %context.subscription.name,
                    consumer_id, "consumer opened");
                let (subscription, key) = (context.subscription.clone(), context.key);
                self.np_consumers.insert(consumer_id, context);
                self.outbox.send_command(&commands::success(request_id));
                subscription.announce(key);
            }
            Ok(CreatedConsumer::Persistent(context)) => {
                let (subscription, key) = (context.subscription.clone(), context.key);
                tracing::info!(peer = %self.peer, client = %self.client_version,
                    topic = %context.topic.full_name, subscription = %subscription.name,
                    consumer_id, "consumer opened");
                self.consumers.insert(consumer_id, context);
                self.outbox.send_command(&commands::success(request_id));
                subscription.announce(key);
            }
        }
    }

    pub(super) fn on_flow(&mut self, command: &BaseCommand) -> Handled {
        let flow = command.flow.as_ref().ok_or("FLOW without body")?;
        if let Some(consumer) = self.np_consumers.get(&flow.consumer_id) {
            consumer.subscription.flow(consumer.key, flow.message_permits);
            return Ok(());
        }
        if let Some(consumer) = self.consumers.get(&flow.consumer_id) {
            consumer.subscription.flow(consumer.key, flow.message_permits);
        }
        Ok(())
    }

    pub(super) fn on_ack(&mut self, command: &BaseCommand) -> Handled {
        let ack = command.ack.as_ref().ok_or("ACK without body")?;
        let ack_type = AckType::try_from(ack.ack_type).unwrap_or(AckType::Individual);
        if self.np_consumers.contains_key(&ack.consumer_id) {
            // Non-persistent: nothing to acknowledge; accepted and ignored.
            if let Some(request_id) = ack.request_id {
                let reply = commands::ack_response(ack.consumer_id, request_id, None);
                self.outbox.send_command(&reply);
            }
            return Ok(());
        }
        let result = match self.consumers.get(&ack.consumer_id) {
            // A consumer detached by a seek: its late acks would undo the reset (Pulsar drops
            // them too, the consumer being closed).
            Some(consumer) if !consumer.subscription.has_consumer(consumer.key) => {
                Err(BrokerError::InvalidRequest("consumer is closed".into()))
            }
            Some(consumer) => consumer
                .subscription
                .ack(Some(consumer.key), ack_type, &ack.message_id)
                .map(|ticket| (consumer.subscription.clone(), ticket)),
            None => Err(BrokerError::InvalidRequest("unknown consumer".into())),
        };
        let Some(request_id) = ack.request_id else { return Ok(()) };
        let (consumer_id, outbox) = (ack.consumer_id, self.outbox.clone());
        match result {
            // The receipt promises durability: it waits for the cursor write.
            Ok((subscription, ticket)) => {
                tokio::spawn(async move {
                    let error = subscription
                        .persisted(ticket)
                        .await
                        .err()
                        .map(|e| (e.server_error(), e.to_string()));
                    outbox.send_command(&commands::ack_response(consumer_id, request_id, error));
                });
            }
            Err(e) => {
                let error = Some((e.server_error(), e.to_string()));
                outbox.send_command(&commands::ack_response(consumer_id, request_id, error));
            }
        }
        Ok(())
    }

    pub(super) fn on_redeliver(&mut self, command: &BaseCommand) -> Handled {
        let request = command
            .redeliver_unacknowledged_messages
            .as_ref()
            .ok_or("REDELIVER_UNACKNOWLEDGED_MESSAGES without body")?;
        if let Some(consumer) = self.consumers.get(&request.consumer_id) {
            consumer.subscription.redeliver(consumer.key, &request.message_ids);
        }
        Ok(())
    }

    /// SEEK: resets the consumer's subscription to a message id or a publish time.
    pub(super) async fn on_seek(&mut self, command: &BaseCommand) -> Handled {
        let seek = command.seek.as_ref().ok_or("SEEK without body")?;
        let request_id = seek.request_id;
        // Error codes as Pulsar's handleSeek sends them.
        if seek.message_id.is_none() && seek.message_publish_time.is_none() {
            self.outbox.send_command(&commands::error(
                request_id,
                ServerError::MetadataError,
                "Message id and message publish time were not present",
            ));
            return Ok(());
        }
        if self.np_consumers.contains_key(&seek.consumer_id) {
            let reply = commands::error(
                request_id,
                ServerError::NotAllowedError,
                "Seek is not supported on non-persistent topics",
            );
            self.outbox.send_command(&reply);
            return Ok(());
        }
        let Some(consumer) = self.consumers.get(&seek.consumer_id) else {
            let reply =
                commands::error(request_id, ServerError::MetadataError, "Consumer not found");
            self.outbox.send_command(&reply);
            return Ok(());
        };
        let (topic, subscription) = (consumer.topic.clone(), consumer.subscription.clone());
        let managed_ledger = topic.managed_ledger.clone();
        let ledgers = managed_ledger.ledgers();
        let last_confirmed = managed_ledger.last_confirmed();
        // The entry to deliver first, or `None` for "after the last entry".
        let target: Result<Option<Position>, BrokerError> =
            match (&seek.message_id, seek.message_publish_time) {
                (Some(id), _) if id.ledger_id == u64::MAX => {
                    // MessageId.earliest (-1, -1).
                    Ok(crate::cursor::next_position(&ledgers, None))
                }
                (Some(id), _) if id.ledger_id >= i64::MAX as u64 => Ok(None), // latest
                (Some(id), _) => {
                    let position = Position::new(id.ledger_id, id.entry_id);
                    Ok(last_confirmed.filter(|last| position <= *last).map(|_| position))
                }
                // A publish time (one of the two is present, checked above).
                (None, time) => {
                    let time = time.unwrap_or(0);
                    tokio::task::spawn_blocking(move || {
                        managed_ledger.first_published_at_or_after(time)
                    })
                    .await
                    .unwrap_or(Err(BrokerError::ShuttingDown))
                }
            };
        let result = match target {
            Ok(target) => {
                let mark_delete = match target {
                    Some(position) => crate::subscription::previous_position(&ledgers, position),
                    None => last_confirmed,
                };
                subscription.reset_cursor(mark_delete).await
            }
            Err(error) => Err(error),
        };
        match result {
            Ok(detached) => {
                // This connection's detached consumers are closed; the client subscribes again.
                self.consumers.retain(|_, c| {
                    !(Arc::ptr_eq(&c.subscription, &subscription) && detached.contains(&c.key))
                });
                tracing::info!(topic = %topic.full_name, subscription = %subscription.name,
                    message_id = ?seek.message_id.as_ref().map(|m| (m.ledger_id, m.entry_id)),
                    publish_time = ?seek.message_publish_time, "cursor reset by seek");
                self.outbox.send_command(&commands::success(request_id));
            }
            Err(error) => self.outbox.send_command(&commands::error(
                request_id,
                ServerError::UnknownError,
                format!("Error when resetting subscription: {error}"),
            )),
        }
        Ok(())
    }

    pub(super) async fn detach_consumer(&mut self, consumer_id: u64) {
        if let Some(consumer) = self.np_consumers.remove(&consumer_id) {
            tracing::info!(peer = %self.peer, client = %self.client_version,
                topic = %consumer.topic.name, subscription = %consumer.subscription.name,
                consumer_id, "consumer closed");
            consumer.detach();
        }
        if let Some(consumer) = self.consumers.remove(&consumer_id) {
            tracing::info!(peer = %self.peer, client = %self.client_version,
                topic = %consumer.topic.full_name, subscription = %consumer.subscription.name,
                consumer_id, "consumer closed");
            consumer.detach().await;
        }
    }

    pub(super) async fn on_close_consumer(&mut self, command: &BaseCommand) -> Handled {
        let request = command.close_consumer.as_ref().ok_or("CLOSE_CONSUMER without body")?;
        if let Some(task) = self.pending_consumers.remove(&request.consumer_id) {
            task.abort();
        }
        let subscription = self.consumers.get(&request.consumer_id).map(|c| c.subscription.clone());
        self.detach_consumer(request.consumer_id).await;
        let success = commands::success(request.request_id);
        let Some(subscription) = subscription else {
            self.outbox.send_command(&success);
            return Ok(());
        };
        // Answered once the consumer's acknowledgements are durable, from a task of its own
        // (no command waits in the connection's loop).
        let outbox = self.outbox.clone();
        tokio::spawn(async move {
            if let Err(error) = subscription.acks_durable().await {
                tracing::warn!(%error, "acknowledgements of a closed consumer not persisted");
            }
            outbox.send_command(&success);
        });
        Ok(())
    }

    pub(super) async fn on_unsubscribe(&mut self, command: &BaseCommand) -> Handled {
        let request = command.unsubscribe.as_ref().ok_or("UNSUBSCRIBE without body")?;
        if let Some(consumer) = self.np_consumers.get(&request.consumer_id) {
            if consumer.subscription.consumer_count() > 1 && !request.force.unwrap_or(false) {
                let error =
                    BrokerError::NotAllowed("subscription has other connected consumers".into());
                self.reply_error(request.request_id, &error);
                return Ok(());
            }
            self.detach_consumer(request.consumer_id).await;
            self.outbox.send_command(&commands::success(request.request_id));
            return Ok(());
        }
        let Some(consumer) = self.consumers.get(&request.consumer_id) else {
            self.reply_error(
                request.request_id,
                &BrokerError::InvalidRequest("unknown consumer".into()),
            );
            return Ok(());
        };
        if consumer.subscription.consumer_count() > 1 && !request.force.unwrap_or(false) {
            let error =
                BrokerError::NotAllowed("subscription has other connected consumers".into());
            self.reply_error(request.request_id, &error);
            return Ok(());
        }
        let (topic, name) = (consumer.topic.clone(), consumer.subscription.name.clone());
        self.detach_consumer(request.consumer_id).await;
        match topic.remove_subscription(&name, true).await {
            Ok(()) => self.outbox.send_command(&commands::success(request.request_id)),
            Err(error) => self.reply_error(request.request_id, &error),
        }
        Ok(())
    }

    pub(super) fn on_get_last_message_id(&mut self, command: &BaseCommand) -> Handled {
        let request =
            command.get_last_message_id.as_ref().ok_or("GET_LAST_MESSAGE_ID without body")?;
        if let Some(consumer) = self.np_consumers.get(&request.consumer_id) {
            // Nothing is stored: the "last" id is the one every message carries.
            let partition = (consumer.topic.partition >= 0).then_some(consumer.topic.partition);
            let last = crate::non_persistent::message_id(partition);
            let reply = commands::get_last_message_id_response(request.request_id, last, None);
            self.outbox.send_command(&reply);
            return Ok(());
        }
        let Some(consumer) = self.consumers.get(&request.consumer_id) else {
            self.reply_error(
                request.request_id,
                &BrokerError::InvalidRequest("unknown consumer".into()),
            );
            return Ok(());
        };
        let managed_ledger = &consumer.topic.managed_ledger;
        let partition = (consumer.topic.partition >= 0).then_some(consumer.topic.partition);
        let last_confirmed = managed_ledger.last_confirmed();
        // A compacted read's last message is the compacted view's while nothing came after
        // its horizon (the topic's last may be a tombstone or a replaced value).
        let compacted = consumer.subscription.compacted_view_of(consumer.key).filter(|view| {
            last_confirmed.is_none_or(|p| (p.ledger_id, p.entry_id) <= view.horizon)
        });
        let last = match (compacted, last_confirmed) {
            (Some(view), _) => match view.last_message() {
                Some(((ledger, entry), batch_index)) => {
                    let mut id = commands::message_id(ledger, entry, partition);
                    id.batch_index = batch_index.map(|i| i as i32);
                    id
                }
                None => commands::message_id(managed_ledger.current_ledger(), u64::MAX, partition),
            },
            (None, Some(p)) => commands::message_id(p.ledger_id, p.entry_id, partition),
            (None, None) => {
                commands::message_id(managed_ledger.current_ledger(), u64::MAX, partition)
            }
        };
        let mark_delete = consumer
            .subscription
            .mark_delete()
            .map(|p| commands::message_id(p.ledger_id, p.entry_id, partition));
        let reply = commands::get_last_message_id_response(request.request_id, last, mark_delete);
        self.outbox.send_command(&reply);
        Ok(())
    }

    pub(super) fn on_consumer_stats(&mut self, command: &BaseCommand) -> Handled {
        let request = command.consumer_stats.as_ref().ok_or("CONSUMER_STATS without body")?;
        let mut response =
            CommandConsumerStatsResponse { request_id: request.request_id, ..Default::default() };
        match self.consumers.get(&request.consumer_id) {
            Some(consumer) => {
                response.r#type = Some(format!("{:?}", consumer.subscription.sub_type()));
            }
            None if self.np_consumers.contains_key(&request.consumer_id) => {
                let consumer = &self.np_consumers[&request.consumer_id];
                response.r#type = Some(format!("{:?}", consumer.subscription.sub_type()));
            }
            None => {
                response.error_code = Some(ServerError::ConsumerNotFound as i32);
                response.error_message = Some("unknown consumer".into());
            }
        }
        let reply = BaseCommand {
            consumer_stats_response: Some(Box::new(response)),
            ..commands::base(Type::ConsumerStatsResponse)
        };
        self.outbox.send_command(&reply);
        Ok(())
    }
}

/// A consumer attached to its subscription, not yet on the connection.
pub(super) enum CreatedConsumer {
    Persistent(ConsumerContext),
    NonPersistent(NpConsumerContext),
}

impl CreatedConsumer {
    /// Detaches it again (the client closed it while it was being created).
    async fn release(self) {
        match self {
            CreatedConsumer::Persistent(context) => context.detach().await,
            CreatedConsumer::NonPersistent(context) => context.detach(),
        }
    }
}

impl ConsumerContext {
    /// Takes the consumer off its subscription; a non-durable subscription (a reader's) goes
    /// with its last consumer.
    pub(super) async fn detach(self) {
        let left = self.subscription.remove_consumer(self.key);
        if left == 0 && !self.subscription.durable {
            let _ = self.topic.remove_subscription(&self.subscription.name, true).await;
        }
    }
}

impl NpConsumerContext {
    pub(super) fn detach(self) {
        self.topic.unsubscribe_consumer(&self.subscription, self.key);
    }
}

/// Everything a SUBSCRIBE needs: the topic (loaded or created), the consumer's schema check,
/// the subscription (created at its start position if new) and the consumer attached to it.
pub(super) async fn create_consumer(
    service: &Arc<BrokerService>,
    outbox: &Outbox,
    request: &CommandSubscribe,
    info: Arc<ClientInfo>,
) -> Result<CreatedConsumer, BrokerError> {
    let consumer_id = request.consumer_id;
    let sub_type = SubType::try_from(request.sub_type).unwrap_or(SubType::Exclusive);
    let name = BrokerService::topic_name(&request.topic)?;
    let create = request.force_topic_creation.unwrap_or(true);
    // Pulsar's `readCompacted` rules (a topic never compacted reads as itself).
    if request.read_compacted == Some(true) {
        if name.domain() == TopicDomain::NonPersistent {
            return Err(BrokerError::NotAllowed(
                "readCompacted only valid on persistent topics".into(),
            ));
        }
        if matches!(sub_type, SubType::Shared | SubType::KeyShared) {
            return Err(BrokerError::NotAllowed(
                "readCompacted only allowed on failover or exclusive subscriptions".into(),
            ));
        }
    }
    let key = service.next_key();
    if name.domain() == TopicDomain::NonPersistent {
        let (topic, policies) = service.non_persistent_topic_with_policies(&name, create).await?;
        if let Some(schema) = request.schema.as_ref().filter(|s| s.r#type != TYPE_AUTO_CONSUME) {
            consumer_schema(service, &name, topic.is_idle(), policies.schema, schema).await?;
        }
        let consumer = NpConsumer::new(
            key,
            consumer_id,
            request.consumer_name.clone().unwrap_or_default(),
            request.priority_level.unwrap_or(0),
            outbox.clone(),
        );
        let subscription = topic.subscribe(
            &request.subscription,
            sub_type,
            consumer,
            request.key_shared_meta.as_ref(),
            service.config.key_shared_use_consistent_hashing,
        )?;
        return Ok(CreatedConsumer::NonPersistent(NpConsumerContext { topic, subscription, key }));
    }
    let durable = request.durable.unwrap_or(true);
    let start = match (&request.start_message_id, durable) {
        (Some(id), false) => StartAt::MessageId(id.clone()),
        _ => match request.initial_position.and_then(|p| InitialPosition::try_from(p).ok()) {
            Some(InitialPosition::Earliest) => StartAt::Earliest,
            _ => StartAt::Latest,
        },
    };
    let (topic, loaded_now) = service.topic_loading(&name, create).await?;
    if !loaded_now {
        // Read again, as at a producer's creation: another broker's admin API may have changed
        // them (a topic this call loaded has just read them).
        topic.refresh_policies().await?;
    }
    let policies = topic.policies();
    if let Some(schema) = request.schema.as_ref().filter(|s| s.r#type != TYPE_AUTO_CONSUME) {
        consumer_schema(service, &name, topic.is_idle(), policies.schema, schema).await?;
    }
    let max_consumers = policies.max_consumers_per_topic;
    crate::admission::topic_has_room(max_consumers, || topic.consumer_count())?;
    // Pulsar's ServerCnx: a durable subscription a consumer would create, while the policies
    // forbid consumers to create subscriptions (readers' non-durable ones always may).
    if durable
        && !policies.allow_auto_subscription_creation
        && !topic.has_subscription(&request.subscription)
    {
        return Err(BrokerError::SubscriptionNotFound("Subscription does not exist".into()));
    }
    let subscription = topic.subscription(&request.subscription, sub_type, durable, start).await?;
    let handle = ConsumerHandle {
        key,
        consumer_id,
        name: request.consumer_name.clone().unwrap_or_default(),
        priority: request.priority_level.unwrap_or(0),
        outbox: outbox.clone(),
        info,
        read_compacted: request.read_compacted == Some(true),
    };
    subscription.add_consumer(handle, sub_type, request.key_shared_meta.as_ref())?;
    Ok(CreatedConsumer::Persistent(ConsumerContext { topic, subscription, key }))
}
