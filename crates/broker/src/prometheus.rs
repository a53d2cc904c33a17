//! `GET /metrics`: the broker's Prometheus exposition, with Apache Pulsar's metric names, types
//! and labels (`NamespaceStatsAggregator`, `TopicStats`), so existing dashboards and alerts work.
//!
//! - Topic level (default; `expose_topic_level_metrics_in_prometheus`): per topic, labels
//!   `cluster`, `namespace`, `topic` (and `partition` with
//!   `split_topic_and_partition_label_in_prometheus`); per subscription, `subscription` too;
//!   `pulsar_topics_count` per namespace. Off: the same families summed per namespace.
//! - Families Pulsar writes "with broker default" start with a `{cluster}` sample of 0, as
//!   Pulsar's do, so a dashboard finds them on an idle broker.
//! - `pulsar_storage_write_latency_le_*` and `pulsar_entry_size_le_*` count, per bucket, the
//!   last completed `stats_update_frequency_seconds` interval (Pulsar's `StatsBuckets`);
//!   their `_count` and `_sum` (latency in microseconds, sizes in bytes, as Pulsar) are typed as
//!   summaries. Counters (`pulsar_in_messages_total`...) are typed as counters (Pulsar says
//!   gauge; the values are the same, and `rate()` is what one does with them). Pulsar's gauges
//!   named `..._count` (`pulsar_consumers_count`, `pulsar_connection_closed_total_count`...)
//!   are untyped: Prometheus reads them as it reads gauges, and promtool's lint reserves the
//!   `_count` suffix for histograms and summaries. What that lint still reports are Pulsar's
//!   `pulsar_entry_size_le_1_kb`-style names ("abbreviated units"): the names stay Pulsar's.
//! - Connections (`pulsar_active_connections`, `pulsar_connection_*`), Magnetar's storage
//!   (`magnetar_journal_*`, `magnetar_ledger_*`, `magnetar_storage_*`), the metadata store
//!   (`magnetar_metadata_*`) and the process (`process_*`).
//!
//! Cost: every number is an atomic the hot paths already update (meters, bucket counters);
//! a scrape reads them with the same code as the admin stats, holding each topic's locks only
//! as long as that does. Nothing here runs on the publish or dispatch path.

use crate::service::BrokerService;
use crate::stats::TopicStats;
use magnetar_metrics::{Exposition, Format, LabelSet, Labels, SampleLabels, WindowReading};
use magnetar_model::policy::BacklogQuotaType;
use magnetar_model::TopicName;
use std::collections::BTreeMap;
use std::time::Duration;

/// Pulsar's `ENTRY_LATENCY_BUCKETS_USEC`: 0.5, 1, 5, 10, 20, 50, 100, 200, 1000 ms.
pub const WRITE_LATENCY_BUCKETS_US: &[u64] =
    &[500, 1_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000, 1_000_000];
const WRITE_LATENCY_NAMES: [&str; 10] = [
    "pulsar_storage_write_latency_le_0_5",
    "pulsar_storage_write_latency_le_1",
    "pulsar_storage_write_latency_le_5",
    "pulsar_storage_write_latency_le_10",
    "pulsar_storage_write_latency_le_20",
    "pulsar_storage_write_latency_le_50",
    "pulsar_storage_write_latency_le_100",
    "pulsar_storage_write_latency_le_200",
    "pulsar_storage_write_latency_le_1000",
    "pulsar_storage_write_latency_overflow",
];

/// Pulsar's `ENTRY_SIZE_BUCKETS_BYTES`: 128 B, 512 B, 1, 2, 4, 16, 100 KiB, 1 MiB.
pub const ENTRY_SIZE_BUCKETS: &[u64] = &[128, 512, 1_024, 2_048, 4_096, 16_384, 102_400, 1_048_576];
const ENTRY_SIZE_NAMES: [&str; 9] = [
    "pulsar_entry_size_le_128",
    "pulsar_entry_size_le_512",
    "pulsar_entry_size_le_1_kb",
    "pulsar_entry_size_le_2_kb",
    "pulsar_entry_size_le_4_kb",
    "pulsar_entry_size_le_16_kb",
    "pulsar_entry_size_le_100_kb",
    "pulsar_entry_size_le_1_mb",
    "pulsar_entry_size_le_overflow",
];

/// One topic's numbers, persistent or not.
struct TopicSample {
    name: TopicName,
    stats: TopicStats,
    write_latency: WindowReading,
    entry_size: WindowReading,
    /// Backlog quota limits (bytes, seconds; -1: none).
    quota_limit_bytes: i64,
    quota_limit_seconds: i64,
}

impl TopicSample {
    fn msg_backlog(&self) -> u64 {
        self.stats.subscriptions.values().map(|s| s.msg_backlog).sum()
    }

    fn delayed(&self) -> u64 {
        self.stats.subscriptions.values().map(|s| s.msg_delayed).sum()
    }
}

/// The exposition of everything this broker serves (`finish` or `finish_parts` it).
pub fn render(service: &BrokerService, format: Format) -> Exposition {
    let config = &service.config;
    let cluster = config.cluster_name.as_str();
    let interval = Duration::from_secs(config.stats_update_frequency_seconds);
    let now = service.ledgers.clock.now();
    let mut samples: Vec<TopicSample> = Vec::new();
    for topic in service.loaded_topics() {
        let policies = topic.policies();
        let quota = |kind| policies.backlog_quotas.get(&kind);
        samples.push(TopicSample {
            name: topic.name.clone(),
            stats: topic.stats(),
            write_latency: topic.write_latency.read(now, interval),
            entry_size: topic.entry_size.read(now, interval),
            quota_limit_bytes: quota(BacklogQuotaType::DestinationStorage)
                .map_or(-1, |q| q.limit_size),
            quota_limit_seconds: quota(BacklogQuotaType::MessageAge)
                .map_or(-1, |q| i64::from(q.limit_time)),
        });
    }
    for topic in service.loaded_non_persistent_topics() {
        samples.push(TopicSample {
            name: topic.name.clone(),
            stats: topic.stats(now),
            write_latency: empty_window(WRITE_LATENCY_BUCKETS_US),
            entry_size: empty_window(ENTRY_SIZE_BUCKETS),
            quota_limit_bytes: -1,
            quota_limit_seconds: -1,
        });
    }
    samples.sort_by_cached_key(|sample| sample.name.to_string());

    // A topic's sample line is about 150 bytes with Pulsar's labels.
    let per_family =
        if config.expose_topic_level_metrics_in_prometheus { samples.len() * 160 } else { 0 };
    let mut out = Exposition::with_family_capacity(format, per_family);
    if config.expose_topic_level_metrics_in_prometheus {
        let levels = Levels {
            split_partition: config.split_topic_and_partition_label_in_prometheus,
            consumers: config.expose_consumer_level_metrics_in_prometheus,
            producers: config.expose_producer_level_metrics_in_prometheus,
        };
        write_topic_level(&mut out, cluster, &samples, levels);
    } else {
        write_namespace_level(&mut out, cluster, &samples);
    }
    service.ledgers.metrics.write(&mut out, cluster, &config.advertised_address);
    service.ledgers.storage.write_metrics(&mut out, &[("cluster", cluster)]);
    if let Some(authenticator) = &config.authenticator {
        write_authentication(&mut out, cluster, authenticator);
    }
    write_process(&mut out);
    out
}

/// Pulsar's `AuthenticationMetrics`: successes by provider and method, failures also by reason.
fn write_authentication(
    out: &mut Exposition,
    cluster: &str,
    authenticator: &magnetar_security::authentication::Authenticator,
) {
    out.declare(
        "pulsar_authentication_success",
        magnetar_metrics::Kind::Counter,
        "Successful authentications.",
    );
    out.declare(
        "pulsar_authentication_failures",
        magnetar_metrics::Kind::Counter,
        "Failed authentications.",
    );
    let counts = authenticator.counts();
    let expired: u64 =
        counts.iter().filter(|c| c.reason == Some("EXPIRED_TOKEN")).map(|c| c.count).sum();
    out.counter(
        "pulsar_expired_token",
        "Tokens refused because they had expired.",
        &[("cluster", cluster)],
        expired,
    );
    for count in counts {
        match count.reason {
            None => out.counter(
                "pulsar_authentication_success",
                "Successful authentications.",
                &[
                    ("cluster", cluster),
                    ("provider_name", count.provider_name),
                    ("auth_method", count.auth_method),
                ],
                count.count,
            ),
            Some(reason) => out.counter(
                "pulsar_authentication_failures",
                "Failed authentications.",
                &[
                    ("cluster", cluster),
                    ("provider_name", count.provider_name),
                    ("auth_method", count.auth_method),
                    ("reason", reason),
                ],
                count.count,
            ),
        }
    }
}

/// A Pulsar gauge; untyped when its name ends in `_count` (see the module docs).
fn gauge(
    out: &mut Exposition,
    name: &'static str,
    help: &'static str,
    labels: &(impl SampleLabels + ?Sized),
    value: f64,
) {
    if name.ends_with("_count") {
        out.untyped(name, help, labels, value);
    } else {
        out.gauge(name, help, labels, value);
    }
}

fn empty_window(bounds: &[u64]) -> WindowReading {
    WindowReading { buckets: vec![0; bounds.len() + 1], count: 0, sum: 0 }
}

/// Families Pulsar writes with a `{cluster}` default sample (`writeMetricWithBrokerDefault`).
const WITH_BROKER_DEFAULT: [(&str, &str); 12] = [
    ("pulsar_topics_count", "Topics in the namespace served by this broker."),
    ("pulsar_subscriptions_count", "Subscriptions."),
    ("pulsar_producers_count", "Producers connected."),
    ("pulsar_consumers_count", "Consumers connected."),
    ("pulsar_rate_in", "Messages published per second."),
    ("pulsar_rate_out", "Messages dispatched per second."),
    ("pulsar_throughput_in", "Bytes published per second."),
    ("pulsar_throughput_out", "Bytes dispatched per second."),
    ("pulsar_storage_size", "Bytes of the topic's ledgers (all replicas)."),
    ("pulsar_storage_logical_size", "Bytes of the topic's ledgers (one copy)."),
    ("pulsar_msg_backlog", "Messages not yet acknowledged, all subscriptions together."),
    ("pulsar_storage_write_rate", "Entries written to storage per second."),
];

fn help(name: &str) -> &'static str {
    WITH_BROKER_DEFAULT.iter().find(|(n, _)| *n == name).map_or("", |(_, h)| h)
}

fn broker_defaults(out: &mut Exposition, cluster: &str, names: &[&'static str]) {
    for &name in names {
        gauge(out, name, help(name), &[("cluster", cluster)], 0.0);
    }
}

/// What the topic-level exposition includes beyond topics and subscriptions.
#[derive(Clone, Copy)]
struct Levels {
    split_partition: bool,
    consumers: bool,
    producers: bool,
}

fn write_topic_level(out: &mut Exposition, cluster: &str, samples: &[TopicSample], levels: Levels) {
    broker_defaults(
        out,
        cluster,
        &[
            "pulsar_topics_count",
            "pulsar_subscriptions_count",
            "pulsar_producers_count",
            "pulsar_consumers_count",
            "pulsar_rate_in",
            "pulsar_rate_out",
            "pulsar_throughput_in",
            "pulsar_throughput_out",
            "pulsar_storage_size",
            "pulsar_storage_logical_size",
            "pulsar_msg_backlog",
        ],
    );
    let mut topics_per_namespace: BTreeMap<String, u64> = BTreeMap::new();
    for sample in samples {
        *topics_per_namespace.entry(sample.name.namespace().to_string()).or_default() += 1;
    }
    for (namespace, count) in &topics_per_namespace {
        let labels: Labels = &[("cluster", cluster), ("namespace", namespace)];
        gauge(out, "pulsar_topics_count", help("pulsar_topics_count"), labels, *count as f64);
    }
    for sample in samples {
        let namespace = sample.name.namespace().to_string();
        let full = sample.name.to_string();
        let (topic, partition) = if levels.split_partition {
            let index = sample.name.partition_index().map_or(-1, i64::from);
            let base =
                if index >= 0 { sample.name.partitioned_topic().to_string() } else { full.clone() };
            (base, Some(index.to_string()))
        } else {
            (full, None)
        };
        let mut labels: Vec<(&str, &str)> =
            vec![("cluster", cluster), ("namespace", &namespace), ("topic", &topic)];
        if let Some(partition) = &partition {
            labels.push(("partition", partition));
        }
        // Rendered once: each of the topic's ~60 samples copies it.
        let labels = LabelSet::new(&labels);
        write_topic(out, &labels, sample);
        if levels.producers {
            for producer in &sample.stats.publishers {
                let labels = labels
                    .with("producer_name", &producer.producer_name)
                    .with("producer_id", &producer.producer_id.to_string());
                write_producer(out, &labels, producer);
            }
        }
        for (subscription, sub) in &sample.stats.subscriptions {
            let labels = labels.with("subscription", subscription);
            write_subscription(out, &labels, sub);
            if levels.consumers {
                for consumer in &sub.consumers {
                    let labels = labels
                        .with("consumer_name", &consumer.consumer_name)
                        .with("consumer_id", &consumer.consumer_id.to_string());
                    write_consumer(out, &labels, consumer);
                }
            }
        }
    }
}

/// Pulsar's producer-level series (`exposeProducerLevelMetricsInPrometheus`).
fn write_producer(
    out: &mut Exposition,
    labels: &(impl SampleLabels + ?Sized),
    producer: &crate::stats::PublisherStats,
) {
    let gauges: [(&'static str, &'static str, f64); 3] = [
        ("pulsar_producer_msg_rate_in", "Messages published per second.", producer.msg_rate_in),
        (
            "pulsar_producer_msg_throughput_in",
            "Bytes published per second.",
            producer.msg_throughput_in,
        ),
        (
            "pulsar_producer_msg_average_Size",
            "Average size of the messages published (bytes).",
            producer.average_msg_size,
        ),
    ];
    for (name, help, value) in gauges {
        gauge(out, name, help, labels, value);
    }
}

/// Pulsar's consumer-level series (`exposeConsumerLevelMetricsInPrometheus`).
fn write_consumer(
    out: &mut Exposition,
    labels: &(impl SampleLabels + ?Sized),
    consumer: &crate::stats::ConsumerStats,
) {
    let gauges: [(&'static str, &'static str, f64); 7] = [
        (
            "pulsar_consumer_msg_rate_redeliver",
            "Messages redelivered to the consumer per second.",
            consumer.msg_rate_redeliver,
        ),
        (
            "pulsar_consumer_unacked_messages",
            "Messages sent to the consumer and not acknowledged.",
            consumer.unacked_messages as f64,
        ),
        (
            "pulsar_consumer_blocked_on_unacked_messages",
            "1 when the consumer gets nothing more until it acknowledges (unacked limit).",
            if consumer.blocked_consumer_on_unacked_msgs { 1.0 } else { 0.0 },
        ),
        (
            "pulsar_consumer_msg_rate_out",
            "Messages sent to the consumer per second.",
            consumer.msg_rate_out,
        ),
        ("pulsar_consumer_msg_ack_rate", "Acknowledgements per second.", consumer.message_ack_rate),
        (
            "pulsar_consumer_msg_throughput_out",
            "Bytes sent to the consumer per second.",
            consumer.msg_throughput_out,
        ),
        (
            "pulsar_consumer_available_permits",
            "Messages the consumer has asked for and not been sent yet.",
            consumer.available_permits as f64,
        ),
    ];
    for (name, help, value) in gauges {
        gauge(out, name, help, labels, value);
    }
    write_out_counters(out, labels, consumer.bytes_out_counter, consumer.msg_out_counter);
}

/// `pulsar_out_bytes_total` and `pulsar_out_messages_total` of a subscription or a consumer.
fn write_out_counters(
    out: &mut Exposition,
    labels: &(impl SampleLabels + ?Sized),
    bytes: u64,
    messages: u64,
) {
    out.counter(
        "pulsar_out_bytes",
        "Bytes dispatched to the subscription's consumers since the topic was loaded.",
        labels,
        bytes,
    );
    out.counter(
        "pulsar_out_messages",
        "Messages dispatched to the subscription's consumers since the topic was loaded.",
        labels,
        messages,
    );
}

fn write_topic(out: &mut Exposition, labels: &(impl SampleLabels + ?Sized), sample: &TopicSample) {
    let stats = &sample.stats;
    let consumers: usize = stats.subscriptions.values().map(|s| s.consumers.len()).sum();
    let gauges: [(&'static str, f64); 10] = [
        ("pulsar_subscriptions_count", stats.subscriptions.len() as f64),
        ("pulsar_producers_count", stats.publishers.len() as f64),
        ("pulsar_consumers_count", consumers as f64),
        ("pulsar_rate_in", stats.msg_rate_in),
        ("pulsar_rate_out", stats.msg_rate_out),
        ("pulsar_throughput_in", stats.msg_throughput_in),
        ("pulsar_throughput_out", stats.msg_throughput_out),
        ("pulsar_storage_size", stats.storage_size as f64),
        ("pulsar_storage_logical_size", stats.storage_size as f64),
        ("pulsar_msg_backlog", sample.msg_backlog() as f64),
    ];
    for (name, value) in gauges {
        gauge(out, name, help(name), labels, value);
    }
    gauge(
        out,
        "pulsar_average_msg_size",
        "Average size of the messages published in the last interval (bytes).",
        labels,
        stats.average_msg_size,
    );
    gauge(
        out,
        "pulsar_storage_backlog_size",
        "Estimated bytes of the slowest durable subscription's backlog.",
        labels,
        stats.backlog_size as f64,
    );
    gauge(
        out,
        "pulsar_storage_offloaded_size",
        "Bytes offloaded to tiered storage.",
        labels,
        stats.offloaded_storage_size as f64,
    );
    gauge(
        out,
        "pulsar_publish_rate_limit_times",
        "Times the publish rate limit paused the topic's producers.",
        labels,
        stats.publish_rate_limited_times as f64,
    );
    gauge(
        out,
        "pulsar_storage_backlog_quota_limit",
        "The backlog quota's size limit (bytes; -1: none).",
        labels,
        sample.quota_limit_bytes as f64,
    );
    gauge(
        out,
        "pulsar_storage_backlog_quota_limit_time",
        "The backlog quota's time limit (seconds; -1: none).",
        labels,
        sample.quota_limit_seconds as f64,
    );
    write_buckets(out, labels, &sample.write_latency, &sample.entry_size);
    out.counter(
        "pulsar_in_bytes",
        "Bytes published to the topic since it was loaded.",
        labels,
        stats.bytes_in_counter,
    );
    out.counter(
        "pulsar_in_messages",
        "Messages published to the topic since it was loaded.",
        labels,
        stats.msg_in_counter,
    );
}

fn write_buckets(
    out: &mut Exposition,
    labels: &(impl SampleLabels + ?Sized),
    latency: &WindowReading,
    size: &WindowReading,
) {
    for (name, count) in WRITE_LATENCY_NAMES.iter().zip(&latency.buckets) {
        gauge(
            out,
            name,
            "Entries whose storage write took this long, in the last stats interval.",
            labels,
            *count as f64,
        );
    }
    out.summary(
        "pulsar_storage_write_latency",
        "Storage writes in the last stats interval, and their total latency (microseconds).",
        labels,
        latency.count,
        latency.sum as f64,
    );
    for (name, count) in ENTRY_SIZE_NAMES.iter().zip(&size.buckets) {
        gauge(
            out,
            name,
            "Entries of this size published in the last stats interval.",
            labels,
            *count as f64,
        );
    }
    out.summary(
        "pulsar_entry_size",
        "Entries published in the last stats interval, and their total size (bytes).",
        labels,
        size.count,
        size.sum as f64,
    );
}

fn write_subscription(
    out: &mut Exposition,
    labels: &(impl SampleLabels + ?Sized),
    sub: &crate::stats::SubscriptionStats,
) {
    let gauges: [(&'static str, &'static str, f64); 18] = [
        (
            "pulsar_subscription_back_log",
            "Messages in the subscription's backlog.",
            sub.msg_backlog as f64,
        ),
        (
            "pulsar_subscription_back_log_no_delayed",
            "Backlog messages not held back by delayed delivery.",
            sub.msg_backlog_no_delayed as f64,
        ),
        (
            "pulsar_subscription_delayed",
            "Messages delayed (delayed delivery).",
            sub.msg_delayed as f64,
        ),
        (
            "pulsar_subscription_msg_rate_redeliver",
            "Messages redelivered per second.",
            sub.msg_rate_redeliver,
        ),
        (
            "pulsar_subscription_unacked_messages",
            "Messages delivered and not acknowledged.",
            sub.unacked_messages as f64,
        ),
        (
            "pulsar_subscription_blocked_on_unacked_messages",
            "1 when dispatch is stopped by the unacknowledged-messages limit.",
            if sub.blocked_subscription_on_unacked_msgs { 1.0 } else { 0.0 },
        ),
        ("pulsar_subscription_msg_rate_out", "Messages dispatched per second.", sub.msg_rate_out),
        ("pulsar_subscription_msg_ack_rate", "Acknowledgements per second.", sub.message_ack_rate),
        (
            "pulsar_subscription_msg_throughput_out",
            "Bytes dispatched per second.",
            sub.msg_throughput_out,
        ),
        (
            "pulsar_subscription_msg_rate_expired",
            "Messages expired per second (TTL).",
            sub.msg_rate_expired,
        ),
        (
            "pulsar_subscription_msg_drop_rate",
            "Messages dropped per second (non-persistent: the consumer had no permits).",
            sub.msg_drop_rate.unwrap_or(0.0),
        ),
        (
            "pulsar_subscription_total_msg_expired",
            "Messages expired (TTL) since the topic was loaded.",
            sub.total_msg_expired as f64,
        ),
        (
            "pulsar_subscription_last_expire_timestamp",
            "When messages last expired (ms since the epoch; 0: never).",
            sub.last_expire_timestamp as f64,
        ),
        (
            "pulsar_subscription_last_acked_timestamp",
            "When a consumer last acknowledged (ms since the epoch; 0: never).",
            sub.last_acked_timestamp as f64,
        ),
        (
            "pulsar_subscription_last_consumed_timestamp",
            "When a message was last dispatched (ms since the epoch; 0: never).",
            sub.last_consumed_timestamp as f64,
        ),
        (
            "pulsar_subscription_last_consumed_flow_timestamp",
            "When a consumer last asked for messages (ms since the epoch; 0: never).",
            sub.last_consumed_flow_timestamp as f64,
        ),
        (
            "pulsar_subscription_consumers_count",
            "Consumers connected to the subscription.",
            sub.consumers.len() as f64,
        ),
        (
            "pulsar_subscription_last_mark_delete_advanced_timestamp",
            "When the mark-delete position last moved (ms since the epoch; 0: never).",
            sub.last_mark_delete_advanced_timestamp as f64,
        ),
    ];
    for (name, help, value) in gauges {
        gauge(out, name, help, labels, value);
    }
    write_out_counters(out, labels, sub.bytes_out_counter, sub.msg_out_counter);
}

/// Pulsar's namespace-level families (`printNamespaceStats`): every topic of a namespace summed.
fn write_namespace_level(out: &mut Exposition, cluster: &str, samples: &[TopicSample]) {
    #[derive(Default)]
    struct Namespace {
        topics: u64,
        subscriptions: u64,
        producers: u64,
        consumers: u64,
        rate_in: f64,
        rate_out: f64,
        throughput_in: f64,
        throughput_out: f64,
        storage: u64,
        backlog_size: u64,
        backlog: u64,
        delayed: u64,
        ack_rate: f64,
        in_bytes: u64,
        in_messages: u64,
        out_bytes: u64,
        out_messages: u64,
        latency: Option<WindowReading>,
        size: Option<WindowReading>,
    }
    fn add(total: &mut Option<WindowReading>, more: &WindowReading) {
        match total {
            None => *total = Some(more.clone()),
            Some(total) => {
                for (t, m) in total.buckets.iter_mut().zip(&more.buckets) {
                    *t += m;
                }
                total.count += more.count;
                total.sum += more.sum;
            }
        }
    }
    let mut namespaces: BTreeMap<String, Namespace> = BTreeMap::new();
    for sample in samples {
        let ns = namespaces.entry(sample.name.namespace().to_string()).or_default();
        let stats = &sample.stats;
        ns.topics += 1;
        ns.subscriptions += stats.subscriptions.len() as u64;
        ns.producers += stats.publishers.len() as u64;
        ns.consumers += stats.subscriptions.values().map(|s| s.consumers.len() as u64).sum::<u64>();
        ns.rate_in += stats.msg_rate_in;
        ns.rate_out += stats.msg_rate_out;
        ns.throughput_in += stats.msg_throughput_in;
        ns.throughput_out += stats.msg_throughput_out;
        ns.storage += stats.storage_size;
        ns.backlog_size += stats.backlog_size;
        ns.backlog += sample.msg_backlog();
        ns.delayed += sample.delayed();
        ns.ack_rate += stats.subscriptions.values().map(|s| s.message_ack_rate).sum::<f64>();
        ns.in_bytes += stats.bytes_in_counter;
        ns.in_messages += stats.msg_in_counter;
        ns.out_bytes += stats.bytes_out_counter;
        ns.out_messages += stats.msg_out_counter;
        add(&mut ns.latency, &sample.write_latency);
        add(&mut ns.size, &sample.entry_size);
    }
    broker_defaults(out, cluster, &WITH_BROKER_DEFAULT.map(|(name, _)| name));
    for (namespace, ns) in &namespaces {
        let labels: Labels = &[("cluster", cluster), ("namespace", namespace)];
        let gauges: [(&'static str, f64); 11] = [
            ("pulsar_topics_count", ns.topics as f64),
            ("pulsar_subscriptions_count", ns.subscriptions as f64),
            ("pulsar_producers_count", ns.producers as f64),
            ("pulsar_consumers_count", ns.consumers as f64),
            ("pulsar_rate_in", ns.rate_in),
            ("pulsar_rate_out", ns.rate_out),
            ("pulsar_throughput_in", ns.throughput_in),
            ("pulsar_throughput_out", ns.throughput_out),
            ("pulsar_storage_size", ns.storage as f64),
            ("pulsar_storage_logical_size", ns.storage as f64),
            ("pulsar_storage_write_rate", ns.rate_in),
        ];
        for (name, value) in gauges {
            gauge(out, name, help(name), labels, value);
        }
        let backlog_labels: Labels =
            &[("cluster", cluster), ("namespace", namespace), ("remote_cluster", "local")];
        gauge(
            out,
            "pulsar_msg_backlog",
            help("pulsar_msg_backlog"),
            backlog_labels,
            ns.backlog as f64,
        );
        gauge(
            out,
            "pulsar_storage_backlog_size",
            "Estimated bytes of the slowest durable subscriptions' backlogs.",
            labels,
            ns.backlog_size as f64,
        );
        gauge(
            out,
            "pulsar_subscription_delayed",
            "Messages delayed (delayed delivery).",
            labels,
            ns.delayed as f64,
        );
        gauge(
            out,
            "pulsar_consumer_msg_ack_rate",
            "Acknowledgements per second.",
            labels,
            ns.ack_rate,
        );
        let latency = ns.latency.clone().unwrap_or_else(|| empty_window(WRITE_LATENCY_BUCKETS_US));
        let size = ns.size.clone().unwrap_or_else(|| empty_window(ENTRY_SIZE_BUCKETS));
        write_buckets(out, labels, &latency, &size);
        out.counter(
            "pulsar_in_bytes",
            "Bytes published since the topics were loaded.",
            labels,
            ns.in_bytes,
        );
        out.counter(
            "pulsar_in_messages",
            "Messages published since the topics were loaded.",
            labels,
            ns.in_messages,
        );
        out.counter(
            "pulsar_out_bytes",
            "Bytes dispatched since the topics were loaded.",
            labels,
            ns.out_bytes,
        );
        out.counter(
            "pulsar_out_messages",
            "Messages dispatched since the topics were loaded.",
            labels,
            ns.out_messages,
        );
    }
}

/// The standard `process_*` series, from `/proc/self` (absent where it cannot be read).
fn write_process(out: &mut Exposition) {
    // SAFETY: sysconf only reads a configuration value.
    let (ticks, page) =
        unsafe { (libc::sysconf(libc::_SC_CLK_TCK), libc::sysconf(libc::_SC_PAGESIZE)) };
    if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
        // Fields after the command (which may hold spaces) start after the last ')'.
        let fields: Vec<&str> =
            stat.rsplit_once(')').map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
        let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
        if let (Some(utime), Some(stime), true) = (field(14), field(15), ticks > 0) {
            out.counter_f64(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                &[],
                (utime + stime) as f64 / ticks as f64,
            );
        }
        if let Some(vsize) = field(23) {
            gauge(
                out,
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                &[],
                vsize as f64,
            );
        }
        if let (Some(rss), true) = (field(24), page > 0) {
            gauge(
                out,
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                &[],
                (rss * page as u64) as f64,
            );
        }
        let boot = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("btime ")?.trim().parse::<u64>().ok())
        });
        if let (Some(start), Some(boot), true) = (field(22), boot, ticks > 0) {
            gauge(
                out,
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                &[],
                boot as f64 + start as f64 / ticks as f64,
            );
        }
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        gauge(out, "process_open_fds", "Number of open file descriptors.", &[], fds.count() as f64);
    }
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the limit into `limit`, a valid rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
        gauge(
            out,
            "process_max_fds",
            "Maximum number of open file descriptors.",
            &[],
            limit.rlim_cur as f64,
        );
    }
}
