//! An async client for the Apache Pulsar binary protocol, for Magnetar
//! and Pulsar brokers.
//!
//! * [`Client`]: connection pool keyed by broker URL, topic lookup
//!   (following redirects) and partition metadata.
//! * [`Producer`]: batching, compression (LZ4, ZLIB, ZSTD, Snappy, framed
//!   as the official clients do), bounded pending messages, receipts in
//!   order, key-hash or round-robin routing over partitions, reconnection
//!   with resend of pending messages; receipts as futures, callbacks, or
//!   tags reported to a [`SendListener`] a batch at a time.
//! * [`Consumer`]: un-batching and decompression, flow control, ack,
//!   cumulative and grouped acks, negative ack, redelivery of everything
//!   unacknowledged.
//! * [`Reader`]: reads a topic from a [`MessageId`] without a durable
//!   subscription.
//!
//! Creating a producer or subscribing retries what may pass (a broker not ready, storage
//! unavailable, a dropped connection: [`Error::is_retriable`]) for up to
//! [`ClientOptions::operation_timeout`] (30 s), as the official clients do.
//!
//! ```no_run
//! # async fn demo() -> magnetar_client::Result<()> {
//! use magnetar_client::{Client, MessageId, ProducerMessage};
//!
//! let client = Client::connect("pulsar://127.0.0.1:6650").await?;
//! let producer = client.producer("events").create().await?;
//! producer.send(ProducerMessage::new("hi").key("k1").property("a", "b")).await?;
//!
//! let mut reader = client.reader("events").start(MessageId::earliest()).create().await?;
//! let msg = reader.next().await?;
//! assert_eq!(msg.text(), Some("hi"));
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

mod auth;
mod client;
mod compression;
mod connection;
mod consumer;
mod error;
mod hash;
mod message;
mod producer;

pub use client::{full_topic_name, partition_topic_name, Client, ClientOptions, LookupResult};
pub use compression::{Compression, MAX_UNCOMPRESSED_SIZE};
pub use connection::PROTOCOL_VERSION;
pub use consumer::{Consumer, ConsumerBuilder, InitialPosition, Reader, ReaderBuilder, SubType};
pub use error::{Error, Result, DEFAULT_OPERATION_TIMEOUT};
pub use hash::{murmur3_32, partition_for_key};
pub use message::{Message, MessageId, ProducerMessage};
pub use producer::{
    Batching, Producer, ProducerBuilder, Routing, SendFuture, SendListener, StoredIds,
};
