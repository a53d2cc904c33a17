//! PRODUCER, SEND and CLOSE_PRODUCER: producers join the connection from a task of their own.

use super::*;

impl Connection {
    /// PRODUCER: answered from a task of its own (a topic load, a schema check or a
    /// WaitForExclusive producer's wait never holds up this connection's other commands); the
    /// producer joins the connection when the task reports back.
    pub(super) fn on_producer(&mut self, command: &BaseCommand) -> Handled {
        let request = command.producer.as_ref().ok_or("PRODUCER without body")?;
        let (request_id, producer_id) = (request.request_id, request.producer_id);
        if self
            .producers
            .get(&producer_id)
            .is_some_and(|p| p.topic.is_closed() || p.closed.load(Ordering::SeqCst))
        {
            // Closed by the broker (topic deleted or unloaded, backlog quota): the client
            // re-creates it under its id, and meets the checks of a new producer.
            self.producers.remove(&producer_id);
            self.closed_by_broker.insert(producer_id);
        }
        if let Some(existing) = self.producers.get(&producer_id) {
            // A client retrying a create it already got: answer the same.
            let version = existing.schema_version.map(commands::schema_version_bytes);
            let last = existing.topic.last_sequence_id(&existing.name);
            let reply =
                commands::producer_success(request_id, existing.name.to_string(), last, version);
            self.outbox.send_command(&reply);
            return Ok(());
        }
        if let Some(existing) = self.np_producers.get(&producer_id) {
            let version = existing.schema_version.map(commands::schema_version_bytes);
            let reply = commands::producer_success(request_id, existing.name.clone(), -1, version);
            self.outbox.send_command(&reply);
            return Ok(());
        }
        if self.pending_producers.contains_key(&producer_id) {
            // As Pulsar: the earlier request for this id is still being served.
            let error = BrokerError::ServiceNotReady(
                "Producer is already present on the connection".into(),
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
            let allowed = authz::authorize_topic(
                &service,
                principal.as_ref(),
                &request.topic,
                TopicOperation::Produce,
                None,
            )
            .await;
            let created = match allowed {
                Ok(()) => create_producer(&service, &outbox, &request, info).await,
                Err(error) => Err(error),
            };
            let finish: Completion = Box::new(move |connection: &mut Connection| {
                connection.open_checked(changes_before, |c| c.producer_created(&request, created))
            });
            finish
        });
        self.pending_producers.insert(producer_id, task);
        Ok(())
    }

    /// A PRODUCER request's outcome, back on the connection: the producer joins it and the
    /// client hears PRODUCER_SUCCESS, or the error. One closed in the meantime is undone.
    pub(super) fn producer_created(
        &mut self,
        request: &CommandProducer,
        created: Result<CreatedProducer, BrokerError>,
    ) {
        let request_id = request.request_id;
        let still_wanted = self.pending_producers.remove(&request.producer_id).is_some();
        let created = match created {
            Ok(created) if !still_wanted => {
                created.release();
                return;
            }
            Ok(created) => created,
            Err(_) if !still_wanted => return,
            Err(error) => {
                self.reply_error(request_id, &error);
                return;
            }
        };
        let mode = access_mode(request);
        let (name, epoch) = (created.name().to_string(), created.epoch());
        tracing::info!(peer = %self.peer, client = %self.client_version, topic = %request.topic,
            producer = %name, producer_id = request.producer_id, ?mode, "producer opened");
        let mut reply = match created {
            CreatedProducer::Persistent(context, _) => {
                self.closed_by_broker.remove(&request.producer_id);
                let version_bytes = context.schema_version.map(commands::schema_version_bytes);
                // A reconnecting producer resumes after its last stored sequence id.
                let last_sequence_id = context.topic.last_sequence_id(&context.name);
                self.producers.insert(request.producer_id, context);
                commands::producer_success(request_id, name, last_sequence_id, version_bytes)
            }
            CreatedProducer::NonPersistent(context, _) => {
                self.closed_by_broker.remove(&request.producer_id);
                // No deduplication on non-persistent topics: last_sequence_id is -1.
                let version = context.schema_version.map(commands::schema_version_bytes);
                self.np_producers.insert(request.producer_id, context);
                commands::producer_success(request_id, name, -1, version)
            }
        };
        if mode != ProducerAccessMode::Shared {
            if let Some(success) = reply.producer_success.as_mut() {
                success.topic_epoch = Some(epoch);
            }
        }
        self.outbox.send_command(&reply);
    }

    pub(super) fn on_send(&mut self, command: &BaseCommand, entry: Option<Bytes>) -> Handled {
        let send = command.send.as_ref().ok_or("SEND without body")?;
        let entry = entry.ok_or("SEND without payload")?;
        let (producer_id, sequence_id) = (send.producer_id, send.sequence_id);
        if let Some(producer) = self.np_producers.get(&producer_id) {
            if producer.topic.exceeds_max_message_size(entry.len()) {
                return self.refuse_send(
                    producer_id,
                    sequence_id,
                    ServerError::NotAllowedError,
                    "Exceed maximum message size",
                );
            }
            // At most once: acknowledged at once with 0:0, as Pulsar's NonPersistentTopic,
            // then handed to the consumers that have permits.
            let highest = send.highest_sequence_id.unwrap_or(0).max(sequence_id);
            let partition = (producer.topic.partition >= 0).then_some(producer.topic.partition);
            let id = crate::non_persistent::message_id(partition);
            let messages = u64::try_from(send.num_messages.unwrap_or(1)).unwrap_or(1).max(1);
            // The publish rate holds here as on persistent topics (Pulsar's
            // `AbstractTopic.incrementPublishCount` serves both).
            let pause = crate::limits::throttle_publish(
                &producer.topic.publish_rate,
                &producer.topic.publish_rate_limited_times,
                messages,
                entry.len() as u64,
                || self.service.ledgers.clock.now_ms(),
            );
            if let Some(pause) = pause {
                pause_reading(&mut self.paused_until, pause);
            }
            producer.info.meter.record(messages, entry.len() as u64);
            self.outbox.send_command(&commands::send_receipt(
                producer_id,
                sequence_id,
                id,
                highest,
            ));
            producer.topic.publish(&entry);
            return Ok(());
        }
        let Some(producer) = self.producers.get(&producer_id) else {
            if self.closed_by_broker.contains(&producer_id) {
                // Written by the client before it heard that its producer is back (the Go
                // client goes on sending while it re-creates one the broker closed): not
                // stored, not answered, resent by the client once the producer is back. An
                // error would make the client drop the connection and resend everything
                // pending, the new producer's sends being stored included (Pulsar ignores
                // sends of recently closed producers the same way).
                return Ok(());
            }
            return self.refuse_send(
                producer_id,
                sequence_id,
                ServerError::ProducerBusy,
                "unknown producer",
            );
        };
        let Some(ticket) = producer.topic.begin_publish() else {
            // Unloading: not stored and not answered. The unload closes this producer once the
            // sends taken before have their receipts, and the client resends whatever is
            // unanswered on its new producer. An error would overtake those receipts: clients
            // close the connection on a send error and resend everything pending, so the
            // accepted sends would be stored twice.
            return Ok(());
        };
        if producer.closed.load(Ordering::SeqCst) {
            // Closed by the broker (a backlog quota), CLOSE_PRODUCER queued or about to be:
            // the same, after the ticket (SeqCst: the close either sees this send counted in
            // and waits for its receipt, or this send sees the flag).
            return Ok(());
        }
        if producer.topic.is_deleted() {
            // Stored here, the entry would be stored again when the client resends it on its
            // new producer (the Go client's duplicate). A retriable error: the client
            // reconnects and resends, as Pulsar answers sends to a fenced topic.
            return self.refuse_send(
                producer_id,
                sequence_id,
                ServerError::ServiceNotReady,
                "topic is being unloaded or deleted",
            );
        }
        let highest = send.highest_sequence_id.unwrap_or(0).max(sequence_id);
        let partition = (producer.partition >= 0).then_some(producer.partition);
        let limits = producer.topic.limits();
        let max_size = limits.max_message_size.load(Ordering::Relaxed) as usize;
        if max_size > 0 && entry.len() > max_size {
            // The topic's maxMessageSize (below the broker's frame limit): Pulsar's
            // `isExceedMaximumMessageSize`, a NotAllowedException.
            return self.refuse_send(
                producer_id,
                sequence_id,
                ServerError::NotAllowedError,
                "Exceed maximum message size",
            );
        }
        // Publish rate: counted here, and past it the connection stops reading (the
        // producer's sends wait in its socket), as Pulsar pauses auto-read.
        let pause = crate::limits::throttle_publish(
            &limits.publish_rate,
            &limits.publish_rate_limited_times,
            u64::try_from(send.num_messages.unwrap_or(1).max(1)).unwrap_or(1),
            entry.len() as u64,
            || producer.topic.managed_ledger.clock().now_ms(),
        );
        if let Some(pause) = pause {
            // (A field, not a method: `producer` borrows `self.producers`.)
            pause_reading(&mut self.paused_until, pause);
        }
        // Chunks before a message's last share its sequence id: only the last one is checked
        // and recorded (metadata parsed only where deduplication is on).
        let counts = !(producer.topic.deduplication_enabled()
            && magnetar_protocol::parse_metadata_and_payload(&entry)
                .is_ok_and(|(metadata, _)| crate::dedup::is_intermediate_chunk(&metadata)));
        let status = if counts {
            producer.topic.check_duplicate(&producer.name, sequence_id, highest)
        } else {
            DupStatus::NotDup
        };
        match status {
            DupStatus::NotDup => {}
            DupStatus::Dup => {
                // Stored before: acknowledged at once with message id -1:-1, as Pulsar does.
                let id = commands::message_id(u64::MAX, u64::MAX, partition);
                let reply = commands::send_receipt(producer_id, sequence_id, id, highest);
                self.outbox.send_command(&reply);
                return Ok(());
            }
            DupStatus::Unknown => {
                // The original is still being written: Pulsar answers PersistenceError and the
                // client resends after reconnecting, when the outcome is known.
                return self.refuse_send(
                    producer_id,
                    highest,
                    ServerError::PersistenceError,
                    "Cannot determine whether the message is a duplicate at this time",
                );
            }
        }
        let messages = u64::try_from(send.num_messages.unwrap_or(1)).unwrap_or(1).max(1);
        producer.info.meter.record(messages, entry.len() as u64);
        producer.topic.in_meter.record(messages, entry.len() as u64);
        producer.topic.entry_size.record(entry.len() as u64);
        let staged_at = producer.topic.managed_ledger.clock().now();
        producer.topic.note_publish(staged_at);
        let outbox = self.outbox.clone();
        let producer_name = producer.name.clone();
        let staged = producer.topic.managed_ledger.append(
            entry,
            move |result: Result<Position, BrokerError>| {
                let topic = ticket.topic();
                let reply = match result {
                    Ok(position) => {
                        let now = topic.managed_ledger.clock().now();
                        topic
                            .write_latency
                            .record_duration_us(now.saturating_duration_since(staged_at));
                        if counts {
                            topic.entry_persisted(&producer_name, highest, position);
                        }
                        let id =
                            commands::message_id(position.ledger_id, position.entry_id, partition);
                        commands::send_receipt(producer_id, sequence_id, id, highest)
                    }
                    Err(error) => {
                        topic.entry_failed();
                        commands::send_error(
                            producer_id,
                            sequence_id,
                            error.server_error(),
                            error.to_string(),
                        )
                    }
                };
                outbox.send_command(&reply);
                drop(ticket); // answered: no longer in flight (an unload may go on)
            },
        );
        if let Err(error) = staged {
            producer.topic.entry_failed();
            if matches!(error, BrokerError::Storage(magnetar_ledger::LedgerError::ShortOfDisk(_))) {
                // Not stored and not answered: a send error has clients drop the connection and
                // resend at once, over and over (the C++ client's send timeout never fired in
                // that loop). The topic's producers are closed instead, and their re-creation is
                // refused while the disk is short (`producer_admission`), on which clients fail
                // what they have pending, with why, as for a backlog quota's
                // `producer_exception`.
                tracing::warn!(topic = %producer.topic.full_name, %error, "send refused: disconnecting the topic's producers");
                producer.topic.disconnect_producers_soon();
                return Ok(());
            }
            return self.refuse_send(
                producer_id,
                sequence_id,
                error.server_error(),
                error.to_string(),
            );
        }
        Ok(())
    }

    /// Answers a SEND with an error: the message is not stored.
    fn refuse_send(
        &self,
        producer_id: u64,
        sequence_id: u64,
        error: ServerError,
        why: impl Into<String>,
    ) -> Handled {
        self.outbox.send_command(&commands::send_error(producer_id, sequence_id, error, why));
        Ok(())
    }

    pub(super) fn on_close_producer(&mut self, command: &BaseCommand) -> Handled {
        let request = command.close_producer.as_ref().ok_or("CLOSE_PRODUCER without body")?;
        self.closed_by_broker.remove(&request.producer_id);
        if let Some(task) = self.pending_producers.remove(&request.producer_id) {
            // Still being created (a WaitForExclusive producer in line, say): stop it; if it
            // had already finished, its completion finds it unwanted and gives the topic back.
            task.abort();
        }
        if let Some(producer) = self.producers.remove(&request.producer_id) {
            producer.topic.remove_producer(&producer.name, producer.key);
            self.log_producer_closed(&producer.topic.full_name, &producer.name, "closed by client");
        }
        if let Some(producer) = self.np_producers.remove(&request.producer_id) {
            producer.topic.producers.remove(&producer.name, producer.key);
            let topic = producer.topic.name.to_string();
            self.log_producer_closed(&topic, &producer.name, "closed by client");
        }
        self.outbox.send_command(&commands::success(request.request_id));
        Ok(())
    }
}

pub(super) fn access_mode(request: &CommandProducer) -> ProducerAccessMode {
    request
        .producer_access_mode
        .and_then(|m| ProducerAccessMode::try_from(m).ok())
        .unwrap_or(ProducerAccessMode::Shared)
}

/// A producer registered on its topic, not yet on the connection.
pub(super) enum CreatedProducer {
    Persistent(ProducerContext, u64),
    NonPersistent(NpProducerContext, u64),
}

impl CreatedProducer {
    fn name(&self) -> &str {
        match self {
            CreatedProducer::Persistent(context, _) => &context.name,
            CreatedProducer::NonPersistent(context, _) => &context.name,
        }
    }

    fn epoch(&self) -> u64 {
        match self {
            CreatedProducer::Persistent(_, epoch) | CreatedProducer::NonPersistent(_, epoch) => {
                *epoch
            }
        }
    }

    /// Gives the topic back (the client closed the producer while it was being created).
    fn release(self) {
        match self {
            CreatedProducer::Persistent(context, _) => {
                context.topic.remove_producer(&context.name, context.key)
            }
            CreatedProducer::NonPersistent(context, _) => {
                context.topic.producers.remove(&context.name, context.key)
            }
        }
    }
}

/// Everything a PRODUCER request needs before the producer may publish: the topic (loaded or
/// created), the schema, the dead-letter producer's initial subscription, and a place in the
/// topic's producers under its access mode. A WaitForExclusive producer that must wait is told
/// so at once (PRODUCER_SUCCESS with producer_ready=false, as Pulsar's `ServerCnx`) and waits
/// here.
pub(super) async fn create_producer(
    service: &Arc<BrokerService>,
    outbox: &Outbox,
    request: &CommandProducer,
    info: Arc<ClientInfo>,
) -> Result<CreatedProducer, BrokerError> {
    let mode = access_mode(request);
    let name = BrokerService::topic_name(&request.topic)?;
    let producer_name = match request.producer_name.clone().filter(|n| !n.is_empty()) {
        Some(name) => name,
        None => service.producer_names.next().await?,
    };
    let key = service.next_key();
    let client = ProducerClient::new(request.producer_id, outbox.clone(), info.clone());
    let closed = client.closed.clone();
    let queued = || {
        let mut waiting = commands::producer_success(request.request_id, &producer_name, -1, None);
        if let Some(success) = waiting.producer_success.as_mut() {
            success.producer_ready = Some(false);
        }
        outbox.send_command(&waiting);
    };
    if name.domain() == TopicDomain::NonPersistent {
        let (topic, policies) = service.non_persistent_topic_with_policies(&name, true).await?;
        let schema = request.schema.as_ref();
        let schema_version = producer_schema(service, &name, schema, policies.schema).await?;
        let epoch = topic
            .producers
            .add(producer_name.clone(), key, mode, request.topic_epoch, client, queued)
            .await?;
        let context = NpProducerContext { topic, name: producer_name, key, info, schema_version };
        return Ok(CreatedProducer::NonPersistent(context, epoch));
    }
    let (topic, loaded_now) = service.topic_loading(&name, true).await?;
    if !loaded_now {
        // Policies may have changed since the topic was loaded (another broker's admin API in
        // cluster mode, seen by the policy watch a moment later): read them again. A topic this
        // call loaded has just read them.
        topic.refresh_policies().await?;
    }
    // The schema first: an incompatible one fails the producer (Pulsar's tryAddSchema).
    let schema_policies = topic.policies().schema;
    let schema_version =
        producer_schema(service, &name, request.schema.as_ref(), schema_policies).await?;
    // The initial subscription (dead-letter producers): created at the earliest position before
    // the producer may publish, as Pulsar's handleProducer does.
    if let Some(initial) = request.initial_subscription_name.as_deref().filter(|n| !n.is_empty()) {
        topic.subscription(initial, SubType::Exclusive, true, StartAt::Earliest).await?;
    }
    // Backlog quotas with a producer policy refuse producers while exceeded, and a disk short
    // of space refuses them all.
    crate::backlog_quota::producer_admission(&topic).await?;
    if let Some(why) = topic.managed_ledger.short_of_disk() {
        return Err(BrokerError::ProducerBlockedQuotaExceededException(format!(
            "disk full: {why}"
        )));
    }
    let epoch = topic
        .add_producer(producer_name.clone(), key, mode, request.topic_epoch, client, queued)
        .await?;
    let partition = topic.partition;
    let context = ProducerContext {
        topic,
        name: producer_name.into(),
        key,
        partition,
        schema_version,
        info,
        closed,
    };
    Ok(CreatedProducer::Persistent(context, epoch))
}

/// Stops the connection reading for `pause` from now (the later of two pauses wins): the
/// publish rate's hold, as Pulsar pauses auto-read.
fn pause_reading(paused_until: &mut Option<tokio::time::Instant>, pause: std::time::Duration) {
    let until = tokio::time::Instant::now() + pause;
    *paused_until = Some(paused_until.map_or(until, |at| at.max(until)));
}
