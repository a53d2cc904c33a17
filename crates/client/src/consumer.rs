//! Consumers and readers: subscription, flow control, un-batching and
//! decompression, acknowledgements, resubscription after a disconnect.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use magnetar_protocol::proto::base_command::Type;
use magnetar_protocol::proto::command_ack::AckType;
use magnetar_protocol::proto::{
    CommandAck, CommandCloseConsumer, CommandMessage, CommandRedeliverUnacknowledgedMessages,
    CommandSubscribe, CommandUnsubscribe, MessageIdData,
};
use magnetar_protocol::{commands, parse_batch, BaseCommand, PayloadSection};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::client::Client;
use crate::compression::Compression;
use crate::connection::{Connection, ConsumerEvent};
use crate::error::{Error, Result};
use crate::message::{Message, MessageId};

pub use magnetar_protocol::proto::command_subscribe::{InitialPosition, SubType};

/// Batch tracker mark of a negatively acknowledged batch.
const NACKED: u32 = u32::MAX;

/// Builds a [`Consumer`]; get one from [`Client::consumer`].
#[derive(Debug)]
pub struct ConsumerBuilder {
    client: Client,
    topic: String,
    subscription: Option<String>,
    sub_type: SubType,
    initial_position: InitialPosition,
    receiver_queue: u32,
    name: Option<String>,
}

impl ConsumerBuilder {
    pub(crate) fn new(client: Client, topic: String) -> Self {
        Self {
            client,
            topic,
            subscription: None,
            sub_type: SubType::Exclusive,
            initial_position: InitialPosition::Latest,
            receiver_queue: 1000,
            name: None,
        }
    }

    /// Subscription name (required).
    pub fn subscription(mut self, name: impl Into<String>) -> Self {
        self.subscription = Some(name.into());
        self
    }

    /// Subscription type (default Exclusive).
    pub fn sub_type(mut self, sub_type: SubType) -> Self {
        self.sub_type = sub_type;
        self
    }

    /// Where a new subscription starts (default Latest).
    pub fn initial_position(mut self, position: InitialPosition) -> Self {
        self.initial_position = position;
        self
    }

    /// Messages the broker may push ahead of [`Consumer::receive`]
    /// (default 1000, per partition). Permits are given back in FLOW
    /// commands each time half of them was used.
    pub fn receiver_queue(mut self, size: u32) -> Self {
        self.receiver_queue = size.max(1);
        self
    }

    /// Consumer name.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Subscribes (to every partition of a partitioned topic).
    pub async fn subscribe(self) -> Result<Consumer> {
        let subscription = self
            .subscription
            .ok_or_else(|| Error::Config("a subscription name is required".into()))?;
        let options = Options {
            subscription,
            sub_type: self.sub_type,
            initial_position: self.initial_position,
            receiver_queue: self.receiver_queue,
            name: self.name,
            durable: true,
            start: None,
        };
        Consumer::subscribe(self.client, &self.topic, options).await
    }
}

/// Builds a [`Reader`]; get one from [`Client::reader`].
#[derive(Debug)]
pub struct ReaderBuilder {
    client: Client,
    topic: String,
    start: MessageId,
    receiver_queue: u32,
}

impl ReaderBuilder {
    pub(crate) fn new(client: Client, topic: String) -> Self {
        Self { client, topic, start: MessageId::latest(), receiver_queue: 1000 }
    }

    /// Where to start: [`MessageId::earliest`], [`MessageId::latest`]
    /// (default) or after a given id (exclusive).
    pub fn start(mut self, id: MessageId) -> Self {
        self.start = id;
        self
    }

    /// Receiver queue size (default 1000).
    pub fn receiver_queue(mut self, size: u32) -> Self {
        self.receiver_queue = size.max(1);
        self
    }

    /// Creates the reader (a non-durable, exclusive subscription).
    pub async fn create(self) -> Result<Reader> {
        let suffix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let options = Options {
            subscription: format!("reader-{:x}-{}", suffix, self.client.next_id()),
            sub_type: SubType::Exclusive,
            initial_position: InitialPosition::Latest,
            receiver_queue: self.receiver_queue,
            name: None,
            durable: false,
            start: Some(self.start),
        };
        Ok(Reader { consumer: Consumer::subscribe(self.client, &self.topic, options).await? })
    }
}

/// Reads a topic in order from a start position; nothing is acknowledged.
#[derive(Debug)]
pub struct Reader {
    consumer: Consumer,
}

impl Reader {
    /// The next message.
    pub async fn next(&mut self) -> Result<Message> {
        self.consumer.receive().await
    }

    /// Closes the reader.
    pub async fn close(self) -> Result<()> {
        self.consumer.close().await
    }
}

#[derive(Debug, Clone)]
struct Options {
    subscription: String,
    sub_type: SubType,
    initial_position: InitialPosition,
    receiver_queue: u32,
    name: Option<String>,
    durable: bool,
    /// Reader start position.
    start: Option<MessageId>,
}

#[derive(Debug)]
struct Part {
    topic: String,
    conn: Arc<Connection>,
    /// Permits used since the last FLOW.
    used: u32,
    /// Last message handed out, to skip redeliveries after resubscribing a reader.
    last: Option<MessageId>,
}

/// Receives messages from a subscription.
///
/// ```no_run
/// # async fn demo(client: magnetar_client::Client) -> magnetar_client::Result<()> {
/// use magnetar_client::{InitialPosition, SubType};
///
/// let mut consumer = client
///     .consumer("events")
///     .subscription("billing")
///     .sub_type(SubType::Shared)
///     .initial_position(InitialPosition::Earliest)
///     .receiver_queue(1000)
///     .subscribe()
///     .await?;
/// for _ in 0..100 {
///     let message = consumer.receive().await?;
///     match message.text() {
///         // Grouped: one ACK command for many messages, as the official clients do.
///         Some(_) => consumer.ack_grouped(&message)?,
///         // Not for us now: the broker delivers it again, with redelivery_count raised.
///         None => consumer.nack(&message)?,
///     }
/// }
/// // Or: everything delivered and not acknowledged comes back.
/// consumer.redeliver_unacknowledged()?;
/// consumer.close().await?; // sends the grouped acknowledgements first
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Consumer {
    client: Client,
    topic: String,
    options: Options,
    parts: HashMap<u64, Part>,
    events_tx: mpsc::UnboundedSender<ConsumerEvent>,
    events: mpsc::UnboundedReceiver<ConsumerEvent>,
    queue: VecDeque<Message>,
    /// Messages of each batch entry not acknowledged yet:
    /// (consumer id, ledger, entry) → remaining.
    batches: Mutex<HashMap<(u64, u64, u64), u32>>,
    /// Acknowledgements of [`Consumer::ack_grouped`] not sent yet.
    grouped: Mutex<GroupedAcks>,
}

/// Grouped acknowledgements waiting to go out in one ACK command per partition.
#[derive(Debug, Default)]
struct GroupedAcks {
    ids: HashMap<u64, Vec<MessageIdData>>,
    count: usize,
    /// When the oldest waiting acknowledgement was added.
    since: Option<Instant>,
}

/// Grouped acknowledgements are sent at least this often ...
const ACK_GROUP_TIME: Duration = Duration::from_millis(100);
/// ... or as soon as this many are waiting (like the Java client's defaults).
const ACK_GROUP_MAX: usize = 1000;

impl Consumer {
    async fn subscribe(client: Client, topic: &str, options: Options) -> Result<Self> {
        let (events_tx, events) = mpsc::unbounded_channel();
        let mut consumer = Consumer {
            client: client.clone(),
            topic: crate::client::full_topic_name(topic),
            options,
            parts: HashMap::new(),
            events_tx,
            events,
            queue: VecDeque::new(),
            batches: Mutex::new(HashMap::new()),
            grouped: Mutex::new(GroupedAcks::default()),
        };
        for (part_topic, _) in client.topic_partitions(topic).await? {
            let consumer_id = client.next_id();
            let mut retry = crate::error::Retry::new(client.operation_timeout());
            let conn = loop {
                match consumer.attach(consumer_id, &part_topic, consumer.options.start).await {
                    Ok(conn) => break conn,
                    Err(error) => retry.after(error).await?,
                }
            };
            consumer
                .parts
                .insert(consumer_id, Part { topic: part_topic, conn, used: 0, last: None });
        }
        Ok(consumer)
    }

    /// Subscribes `consumer_id` to `topic` and grants the initial permits.
    async fn attach(
        &self,
        consumer_id: u64,
        topic: &str,
        start: Option<MessageId>,
    ) -> Result<Arc<Connection>> {
        let conn = self.client.topic_connection(topic).await?;
        conn.register_consumer(consumer_id, self.events_tx.clone())?;
        let request_id = conn.request_id();
        let o = &self.options;
        let command = BaseCommand {
            subscribe: Some(Box::new(CommandSubscribe {
                topic: topic.to_string(),
                subscription: o.subscription.clone(),
                sub_type: o.sub_type as i32,
                consumer_id,
                request_id,
                consumer_name: o.name.clone(),
                durable: Some(o.durable),
                start_message_id: start.map(|id| id.entry()),
                initial_position: Some(o.initial_position as i32),
                ..Default::default()
            })),
            ..commands::base(Type::Subscribe)
        };
        if let Err(e) = conn.request(request_id, &command, "SUBSCRIBE").await {
            conn.unregister_consumer(consumer_id);
            return Err(e);
        }
        conn.send_command(&commands::flow(consumer_id, o.receiver_queue))?;
        Ok(conn)
    }

    /// The topic (full name).
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The subscription name.
    pub fn subscription(&self) -> &str {
        &self.options.subscription
    }

    /// Waits for the next message.
    pub async fn receive(&mut self) -> Result<Message> {
        loop {
            if let Some(message) = self.queue.pop_front() {
                self.used_permits(message.consumer_id, 1);
                if let Some(part) = self.parts.get_mut(&message.consumer_id) {
                    part.last = Some(message.id);
                }
                return Ok(message);
            }
            let flush_at = self.lock_grouped().since.map(|since| since + ACK_GROUP_TIME);
            let event = match flush_at {
                Some(at) => tokio::select! {
                    event = self.events.recv() => event,
                    () = tokio::time::sleep_until(at) => {
                        self.flush_acks()?;
                        continue;
                    }
                },
                None => self.events.recv().await,
            };
            match event {
                Some(ConsumerEvent::Message { consumer_id, command, payload }) => {
                    self.accept(consumer_id, &command, *payload)?
                }
                Some(ConsumerEvent::Closed { consumer_id }) => {
                    self.resubscribe(consumer_id).await?
                }
                None => return Err(Error::Closed),
            }
        }
    }

    /// Queues the messages of one MESSAGE, unless its partition was closed meanwhile.
    fn accept(
        &mut self,
        consumer_id: u64,
        command: &CommandMessage,
        section: PayloadSection,
    ) -> Result<()> {
        if self.parts.contains_key(&consumer_id) {
            self.unpack(consumer_id, command, section)?;
        }
        Ok(())
    }

    /// Drops the messages of one partition queued here and what is known of their batches
    /// (the broker sends them again); returns how many messages were dropped.
    fn forget_queued(&mut self, consumer_id: u64) -> u32 {
        let before = self.queue.len();
        self.queue.retain(|m| m.consumer_id != consumer_id);
        self.lock_batches().retain(|&(c, _, _), _| c != consumer_id);
        (before - self.queue.len()) as u32
    }

    fn used_permits(&mut self, consumer_id: u64, n: u32) {
        let threshold = (self.options.receiver_queue / 2).max(1);
        if let Some(part) = self.parts.get_mut(&consumer_id) {
            part.used += n;
            if part.used >= threshold
                && part.conn.send_command(&commands::flow(consumer_id, part.used)).is_ok()
            {
                part.used = 0;
            }
        }
    }

    /// Whether a reader must skip `id` (at or before its start position).
    fn skip(&self, consumer_id: u64, id: &MessageId) -> bool {
        if self.options.durable {
            return false;
        }
        let start = self.parts.get(&consumer_id).and_then(|p| p.last).or(self.options.start);
        let Some(start) = start else { return false };
        if start == MessageId::earliest() || start == MessageId::latest() {
            return false;
        }
        if start.batch_index < 0 || id.batch_index < 0 {
            (id.ledger_id, id.entry_id) <= (start.ledger_id, start.entry_id)
        } else {
            (id.ledger_id, id.entry_id, id.batch_index)
                <= (start.ledger_id, start.entry_id, start.batch_index)
        }
    }

    /// Splits one MESSAGE into messages (decompressing, un-batching).
    fn unpack(
        &mut self,
        consumer_id: u64,
        command: &CommandMessage,
        section: PayloadSection,
    ) -> Result<()> {
        let metadata = section.metadata;
        let topic = self.parts.get(&consumer_id).map(|p| p.topic.clone()).unwrap_or_default();
        let compression =
            Compression::from_wire(metadata.compression.unwrap_or(0)).ok_or_else(|| {
                Error::Compression(format!("unknown codec {:?}", metadata.compression))
            })?;
        let payload = if compression == Compression::None {
            section.payload
        } else {
            let size = metadata.uncompressed_size.unwrap_or(0) as usize;
            Bytes::from(compression.decompress(&section.payload, size)?)
        };
        let wire = &command.message_id;
        let base = MessageId::new(wire.ledger_id, wire.entry_id, wire.partition());
        let props = |kvs: &[magnetar_protocol::proto::KeyValue]| -> BTreeMap<String, String> {
            kvs.iter().map(|kv| (kv.key.clone(), kv.value.clone())).collect()
        };
        let redelivery_count = command.redelivery_count.unwrap_or(0);
        let Some(count) = metadata.num_messages_in_batch else {
            if self.skip(consumer_id, &base) {
                self.used_permits(consumer_id, 1);
                return Ok(());
            }
            self.queue.push_back(Message {
                id: base,
                topic,
                payload,
                key: metadata.partition_key.clone(),
                properties: props(&metadata.properties),
                event_time: metadata.event_time.filter(|&t| t > 0),
                publish_time: metadata.publish_time,
                producer_name: metadata.producer_name.clone(),
                sequence_id: metadata.sequence_id,
                redelivery_count,
                consumer_id,
            });
            return Ok(());
        };
        let count = u32::try_from(count).unwrap_or(0);
        let mut delivered = 0u32;
        let mut skipped = 0u32;
        for (index, item) in parse_batch(payload, count).enumerate() {
            let item = item.map_err(|e| Error::Protocol(e.to_string()))?;
            let index = index as i32;
            let mut id = base;
            id.batch_index = index;
            id.batch_size = count as i32;
            // ack_set: a set bit means "not acknowledged yet".
            let acked = !command.ack_set.is_empty()
                && command
                    .ack_set
                    .get(index as usize / 64)
                    .is_none_or(|word| word & (1i64 << (index % 64)) == 0);
            if acked || item.metadata.compacted_out() || self.skip(consumer_id, &id) {
                skipped += 1;
                continue;
            }
            delivered += 1;
            let single = item.metadata;
            self.queue.push_back(Message {
                id,
                topic: topic.clone(),
                payload: item.payload,
                key: single.partition_key.clone(),
                properties: props(&single.properties),
                event_time: single.event_time.filter(|&t| t > 0),
                publish_time: metadata.publish_time,
                producer_name: metadata.producer_name.clone(),
                sequence_id: single.sequence_id.unwrap_or(metadata.sequence_id + index as u64),
                redelivery_count,
                consumer_id,
            });
        }
        if delivered > 0 && self.options.durable {
            self.lock_batches().insert((consumer_id, base.ledger_id, base.entry_id), delivered);
        }
        if delivered == 0 && self.options.durable {
            // Everything was acknowledged already: make sure the broker knows.
            let _ = self.send_ack(consumer_id, base.entry(), AckType::Individual, None);
        }
        if skipped > 0 {
            self.used_permits(consumer_id, skipped);
        }
        Ok(())
    }

    fn lock_batches(&self) -> std::sync::MutexGuard<'_, HashMap<(u64, u64, u64), u32>> {
        self.batches.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn conn_of(&self, consumer_id: u64) -> Result<&Arc<Connection>> {
        self.parts.get(&consumer_id).map(|p| &p.conn).ok_or(Error::Closed)
    }

    fn send_ack(
        &self,
        consumer_id: u64,
        id: MessageIdData,
        ack_type: AckType,
        request_id: Option<u64>,
    ) -> Result<BaseCommand> {
        let command = BaseCommand {
            ack: Some(Box::new(CommandAck {
                consumer_id,
                ack_type: ack_type as i32,
                message_id: vec![id],
                request_id,
                ..Default::default()
            })),
            ..commands::base(Type::Ack)
        };
        if request_id.is_none() {
            self.conn_of(consumer_id)?.send_command(&command)?;
        }
        Ok(command)
    }

    async fn ack_entry(
        &self,
        consumer_id: u64,
        id: MessageIdData,
        ack_type: AckType,
    ) -> Result<()> {
        let conn = self.conn_of(consumer_id)?.clone();
        let request_id = conn.request_id();
        let command = self.send_ack(consumer_id, id, ack_type, Some(request_id))?;
        let reply = conn.request(request_id, &command, "ACK_RESPONSE").await?;
        match reply.ack_response {
            Some(response) if response.error.is_some() => {
                Err(Error::server(response.error.unwrap_or(0), response.message()))
            }
            _ => Ok(()),
        }
    }

    /// Acknowledges one message and waits for the broker's confirmation.
    ///
    /// A message of a batch is acknowledged to the broker together with the
    /// last unacknowledged message of its batch (the broker tracks entries).
    pub async fn ack(&self, message: &Message) -> Result<()> {
        if !self.entry_done(message) {
            return Ok(());
        }
        self.ack_entry(message.consumer_id, message.id.entry(), AckType::Individual).await
    }

    /// Acknowledges one message without waiting: acknowledgements are
    /// grouped into one ACK command per partition, sent when 1000 are
    /// waiting, 100 ms after the oldest (while [`Consumer::receive`] runs),
    /// on [`Consumer::flush_acks`] and on [`Consumer::close`]. This is what
    /// the official clients do by default; use it for throughput.
    pub fn ack_grouped(&self, message: &Message) -> Result<()> {
        if !self.entry_done(message) {
            return Ok(());
        }
        let full = {
            let mut grouped = self.lock_grouped();
            grouped.ids.entry(message.consumer_id).or_default().push(message.id.entry());
            grouped.count += 1;
            grouped.since.get_or_insert_with(Instant::now);
            grouped.count >= ACK_GROUP_MAX
        };
        if full {
            self.flush_acks()?;
        }
        Ok(())
    }

    /// Sends the acknowledgements [`Consumer::ack_grouped`] holds.
    pub fn flush_acks(&self) -> Result<()> {
        let ids = {
            let mut grouped = self.lock_grouped();
            grouped.count = 0;
            grouped.since = None;
            std::mem::take(&mut grouped.ids)
        };
        for (consumer_id, message_id) in ids {
            let command = BaseCommand {
                ack: Some(Box::new(CommandAck {
                    consumer_id,
                    ack_type: AckType::Individual as i32,
                    message_id,
                    ..Default::default()
                })),
                ..commands::base(Type::Ack)
            };
            // A partition closed meanwhile redelivers these messages: not an error.
            if let Ok(conn) = self.conn_of(consumer_id) {
                conn.send_command(&command)?;
            }
        }
        Ok(())
    }

    /// Whether acknowledging `message` completes its entry (always for a
    /// message outside a batch; for the last unacknowledged one of a batch).
    fn entry_done(&self, message: &Message) -> bool {
        let id = message.id;
        if id.batch_index < 0 {
            return true;
        }
        let mut batches = self.lock_batches();
        let key = (message.consumer_id, id.ledger_id, id.entry_id);
        match batches.get_mut(&key) {
            // The batch was negatively acknowledged: it comes back whole
            // and is acknowledged from the new delivery.
            Some(&mut NACKED) => false,
            Some(left) if *left > 1 => {
                *left -= 1;
                false
            }
            _ => {
                batches.remove(&key);
                true
            }
        }
    }

    fn lock_grouped(&self) -> std::sync::MutexGuard<'_, GroupedAcks> {
        self.grouped.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Acknowledges this message and every earlier one of its partition.
    ///
    /// For a message inside a batch, the whole batch entry is acknowledged.
    pub async fn ack_cumulative(&self, message: &Message) -> Result<()> {
        let id = message.id;
        self.lock_batches().retain(|&(c, l, e), _| {
            c != message.consumer_id || (l, e) > (id.ledger_id, id.entry_id)
        });
        self.ack_entry(message.consumer_id, id.entry(), AckType::Cumulative).await
    }

    /// Negative acknowledgement: asks the broker to redeliver the message
    /// now. For a message inside a batch the whole batch is redelivered.
    pub fn nack(&self, message: &Message) -> Result<()> {
        let id = message.id;
        if id.batch_index >= 0 {
            self.lock_batches().insert((message.consumer_id, id.ledger_id, id.entry_id), NACKED);
        }
        let command = BaseCommand {
            redeliver_unacknowledged_messages: Some(Box::new(
                CommandRedeliverUnacknowledgedMessages {
                    consumer_id: message.consumer_id,
                    message_ids: vec![id.entry()],
                    ..Default::default()
                },
            )),
            ..commands::base(Type::RedeliverUnacknowledgedMessages)
        };
        self.conn_of(message.consumer_id)?.send_command(&command)
    }

    /// Asks the broker to redeliver every message this consumer holds unacknowledged (as
    /// Pulsar's `redeliverUnacknowledgedMessages`). Messages queued here and not yet received
    /// are dropped, and their permits returned, since they come again. A message the broker
    /// had already sent may arrive twice: delivery is at least once.
    pub fn redeliver_unacknowledged(&mut self) -> Result<()> {
        // Messages that arrived but were not unpacked yet are dropped with the queue.
        let mut closed = Vec::new();
        while let Ok(event) = self.events.try_recv() {
            match event {
                ConsumerEvent::Message { consumer_id, command, payload } => {
                    self.accept(consumer_id, &command, *payload)?
                }
                closed_event @ ConsumerEvent::Closed { .. } => closed.push(closed_event),
            }
        }
        for event in closed {
            // `receive` re-attaches the partition.
            let _ = self.events_tx.send(event);
        }
        let ids: Vec<u64> = self.parts.keys().copied().collect();
        for consumer_id in ids {
            let dropped = self.forget_queued(consumer_id);
            let command = BaseCommand {
                redeliver_unacknowledged_messages: Some(Box::new(
                    CommandRedeliverUnacknowledgedMessages { consumer_id, ..Default::default() },
                )),
                ..commands::base(Type::RedeliverUnacknowledgedMessages)
            };
            self.conn_of(consumer_id)?.send_command(&command)?;
            // After the command: permits freed by the dropped messages must not let the
            // broker send more before it has taken the pending ones back.
            if dropped > 0 {
                self.used_permits(consumer_id, dropped);
            }
        }
        Ok(())
    }

    /// Re-attaches one partition after the broker or connection closed it.
    async fn resubscribe(&mut self, consumer_id: u64) -> Result<()> {
        let Some(part) = self.parts.get(&consumer_id) else { return Ok(()) };
        let topic = part.topic.clone();
        let start = part.last.or(self.options.start);
        // Drop what was queued from the old attachment: the broker resends it. The new
        // attachment starts with fresh permits, so the dropped ones are not returned.
        self.forget_queued(consumer_id);
        let mut backoff = Duration::from_millis(50);
        let give_up = Instant::now() + Duration::from_secs(60);
        loop {
            match self.attach(consumer_id, &topic, start).await {
                Ok(conn) => {
                    if let Some(part) = self.parts.get_mut(&consumer_id) {
                        part.conn = conn;
                        part.used = 0;
                    }
                    return Ok(());
                }
                Err(error) if Instant::now() < give_up => {
                    tracing::debug!(%topic, %error, "resubscribe failed, retrying");
                    // Backoff between attempts, not synchronisation.
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Deletes the subscription (the consumer must be its only one).
    pub async fn unsubscribe(mut self) -> Result<()> {
        let parts = std::mem::take(&mut self.parts);
        for (&consumer_id, part) in &parts {
            part.conn.unregister_consumer(consumer_id);
            let request_id = part.conn.request_id();
            let command = BaseCommand {
                unsubscribe: Some(Box::new(CommandUnsubscribe {
                    consumer_id,
                    request_id,
                    ..Default::default()
                })),
                ..commands::base(Type::Unsubscribe)
            };
            part.conn.request(request_id, &command, "UNSUBSCRIBE").await?;
        }
        Ok(())
    }

    /// Closes the consumer; unacknowledged messages go to other consumers.
    /// (Dropping a consumer also closes it, without waiting.)
    pub async fn close(mut self) -> Result<()> {
        self.flush_acks()?;
        let parts = std::mem::take(&mut self.parts);
        for (&consumer_id, part) in &parts {
            part.conn.unregister_consumer(consumer_id);
            let request_id = part.conn.request_id();
            let command = BaseCommand {
                close_consumer: Some(Box::new(CommandCloseConsumer {
                    consumer_id,
                    request_id,
                    ..Default::default()
                })),
                ..commands::base(Type::CloseConsumer)
            };
            part.conn.request(request_id, &command, "CLOSE_CONSUMER").await?;
        }
        Ok(())
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        let _ = self.flush_acks();
        // Not closed explicitly: tell the broker without waiting for the reply.
        for (&consumer_id, part) in &self.parts {
            part.conn.unregister_consumer(consumer_id);
            let command = BaseCommand {
                close_consumer: Some(Box::new(CommandCloseConsumer {
                    consumer_id,
                    request_id: part.conn.request_id(),
                    ..Default::default()
                })),
                ..commands::base(Type::CloseConsumer)
            };
            let _ = part.conn.send_command(&command);
        }
    }
}
