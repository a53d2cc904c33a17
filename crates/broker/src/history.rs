//! The recent history behind the web console's live charts: every [`SAMPLE_INTERVAL`] the
//! sampler task reads the counters of every loaded topic and keeps, in memory, the broker's
//! totals (rates in and out, backlog, storage) and the series of a bounded number of topics.
//!
//! Bounded: [`CAPACITY`] points per series (10 minutes at one point per 2 s), one series of
//! totals plus at most [`MAX_TOPIC_SERIES`] topic series; when every topic slot is taken, an
//! active topic takes over the slot of the topic idle the longest. Nothing is persisted: the
//! history starts empty at each start.
//!
//! Rates come from the counters' deltas between two samples. The sampler reads the raw counters
//! only ([`crate::stats::Meter::messages`]), never `Meter::read_at`, so it does not move the
//! rate windows of the admin API's topic stats. A topic loaded since the previous sample counts
//! from zero; a counter that went down (the topic was unloaded and loaded again in between)
//! counts from zero too.

use crate::service::BrokerService;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Time between two samples.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(2);
/// Points kept per series: 10 minutes of samples.
pub const CAPACITY: usize = 300;
/// Topics with a series of their own, at most.
pub const MAX_TOPIC_SERIES: usize = 64;

/// A topic's monotonic counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub msg_in: u64,
    pub bytes_in: u64,
    pub msg_out: u64,
    pub bytes_out: u64,
    pub redelivered: u64,
}

impl Counters {
    /// What was counted since `before`; a counter below its earlier value started again.
    fn since(&self, before: &Counters) -> Counters {
        let delta = |now: u64, then: u64| if now >= then { now - then } else { now };
        Counters {
            msg_in: delta(self.msg_in, before.msg_in),
            bytes_in: delta(self.bytes_in, before.bytes_in),
            msg_out: delta(self.msg_out, before.msg_out),
            bytes_out: delta(self.bytes_out, before.bytes_out),
            redelivered: delta(self.redelivered, before.redelivered),
        }
    }
}

/// One topic as the sampler reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicSample {
    /// The full name (`persistent://t/ns/topic`).
    pub name: String,
    pub counters: Counters,
    /// Entries not yet acknowledged, all subscriptions together (Pulsar's `msgBacklog` summed).
    pub backlog: u64,
    pub storage_size: u64,
    pub producers: u64,
    pub subscriptions: u64,
    pub consumers: u64,
}

/// One point of a series, named like Pulsar's topic stats.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryPoint {
    /// When the sample was taken, ms since the epoch.
    pub time_ms: u64,
    pub msg_rate_in: f64,
    pub msg_rate_out: f64,
    pub msg_throughput_in: f64,
    pub msg_throughput_out: f64,
    pub msg_rate_redeliver: f64,
    pub msg_backlog: u64,
    pub storage_size: u64,
    pub topics: u64,
    pub producers: u64,
    pub subscriptions: u64,
    pub consumers: u64,
}

impl HistoryPoint {
    fn add(&mut self, other: &HistoryPoint) {
        self.msg_rate_in += other.msg_rate_in;
        self.msg_rate_out += other.msg_rate_out;
        self.msg_throughput_in += other.msg_throughput_in;
        self.msg_throughput_out += other.msg_throughput_out;
        self.msg_rate_redeliver += other.msg_rate_redeliver;
        self.msg_backlog += other.msg_backlog;
        self.storage_size += other.storage_size;
        self.topics += other.topics;
        self.producers += other.producers;
        self.subscriptions += other.subscriptions;
        self.consumers += other.consumers;
    }

    fn active(&self) -> bool {
        self.msg_rate_in > 0.0 || self.msg_rate_out > 0.0
    }
}

/// What the console's history endpoint answers: one series, oldest point first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryView {
    /// Time between two points (0: no sampler).
    pub interval_ms: u64,
    /// Points a series holds at most.
    pub capacity: usize,
    /// The topic of a topic's series; absent for the broker's totals.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    pub points: Vec<HistoryPoint>,
}

struct TopicSeries {
    points: VecDeque<HistoryPoint>,
    /// When the topic last had a non-zero rate (its slot goes to an active topic first).
    last_active_ms: u64,
}

/// The bounded in-memory history (pure: the caller passes the samples and the time).
pub struct History {
    capacity: usize,
    max_topic_series: usize,
    totals: VecDeque<HistoryPoint>,
    topics: HashMap<String, TopicSeries>,
    /// The previous sample's time and counters, by topic: what the next rates are computed from.
    previous_at: Option<Instant>,
    previous: HashMap<String, Counters>,
}

impl Default for History {
    fn default() -> Self {
        History::new(CAPACITY, MAX_TOPIC_SERIES)
    }
}

impl History {
    /// A history of `capacity` points per series and at most `max_topic_series` topic series.
    pub fn new(capacity: usize, max_topic_series: usize) -> Self {
        History {
            capacity: capacity.max(1),
            max_topic_series,
            totals: VecDeque::new(),
            topics: HashMap::new(),
            previous_at: None,
            previous: HashMap::new(),
        }
    }

    /// Adds the sample of every loaded topic taken at `at` (`time_ms` on the wall clock). The
    /// first call only sets the baseline for rates (its rates are zero).
    pub fn record(&mut self, at: Instant, time_ms: u64, samples: Vec<TopicSample>) {
        let seconds = self
            .previous_at
            .map(|before| at.saturating_duration_since(before).as_secs_f64())
            .filter(|&s| s > 0.0);
        let rate = |count: u64| seconds.map_or(0.0, |s| count as f64 / s);
        let mut total = HistoryPoint { time_ms, ..Default::default() };
        let mut counters = HashMap::with_capacity(samples.len());
        let mut points = Vec::with_capacity(samples.len());
        for sample in samples {
            let delta = match self.previous.get(&sample.name) {
                _ if seconds.is_none() => Counters::default(),
                Some(before) => sample.counters.since(before),
                None => sample.counters,
            };
            let point = HistoryPoint {
                time_ms,
                msg_rate_in: rate(delta.msg_in),
                msg_rate_out: rate(delta.msg_out),
                msg_throughput_in: rate(delta.bytes_in),
                msg_throughput_out: rate(delta.bytes_out),
                msg_rate_redeliver: rate(delta.redelivered),
                msg_backlog: sample.backlog,
                storage_size: sample.storage_size,
                topics: 1,
                producers: sample.producers,
                subscriptions: sample.subscriptions,
                consumers: sample.consumers,
            };
            total.add(&point);
            counters.insert(sample.name.clone(), sample.counters);
            points.push((sample.name, point));
        }
        push_bounded(&mut self.totals, total, self.capacity);
        self.record_topics(time_ms, points);
        self.previous_at = Some(at);
        self.previous = counters;
    }

    /// Extends the topic series; gone topics lose theirs, new ones get a free slot or the slot
    /// of the topic idle the longest, if they are active and it is not.
    fn record_topics(&mut self, time_ms: u64, points: Vec<(String, HistoryPoint)>) {
        let loaded: std::collections::HashSet<&str> =
            points.iter().map(|(name, _)| name.as_str()).collect();
        self.topics.retain(|name, _| loaded.contains(name.as_str()));
        let mut newcomers = Vec::new();
        for (name, point) in points {
            match self.topics.get_mut(&name) {
                Some(series) => {
                    if point.active() {
                        series.last_active_ms = time_ms;
                    }
                    push_bounded(&mut series.points, point, self.capacity);
                }
                None => newcomers.push((name, point)),
            }
        }
        for (name, point) in newcomers {
            if self.topics.len() >= self.max_topic_series {
                if !point.active() {
                    continue;
                }
                let idlest = self
                    .topics
                    .iter()
                    .filter(|(_, series)| series.last_active_ms < time_ms)
                    .min_by_key(|(_, series)| series.last_active_ms)
                    .map(|(name, _)| name.clone());
                let Some(idle) = idlest else { continue };
                self.topics.remove(&idle);
            }
            let last_active_ms = if point.active() { time_ms } else { 0 };
            self.topics
                .insert(name, TopicSeries { points: VecDeque::from([point]), last_active_ms });
        }
    }

    /// The broker's totals, oldest first.
    pub fn totals(&self) -> HistoryView {
        self.view(None, self.totals.iter().cloned().collect())
    }

    /// The series of `topic` (full name); no points when it has none.
    pub fn topic(&self, topic: &str) -> HistoryView {
        let points = self
            .topics
            .get(topic)
            .map(|series| series.points.iter().cloned().collect())
            .unwrap_or_default();
        self.view(Some(topic.to_string()), points)
    }

    /// How many topics have a series now.
    pub fn topic_series(&self) -> usize {
        self.topics.len()
    }

    fn view(&self, topic: Option<String>, points: Vec<HistoryPoint>) -> HistoryView {
        HistoryView {
            interval_ms: SAMPLE_INTERVAL.as_millis() as u64,
            capacity: self.capacity,
            topic,
            points,
        }
    }
}

fn push_bounded(points: &mut VecDeque<HistoryPoint>, point: HistoryPoint, capacity: usize) {
    while points.len() >= capacity {
        points.pop_front();
    }
    points.push_back(point);
}

/// Starts the sampler; it ends when the service is dropped.
pub fn start(service: &Arc<BrokerService>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run(Arc::downgrade(service)))
}

async fn run(service: Weak<BrokerService>) {
    let mut ticks = tokio::time::interval(SAMPLE_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(service) = service.upgrade() else { return };
        sample(&service);
    }
}

/// Takes one sample of every loaded topic now and records it.
pub fn sample(service: &BrokerService) {
    let mut samples: Vec<TopicSample> =
        service.loaded_topics().iter().map(|topic| topic.history_sample()).collect();
    samples
        .extend(service.loaded_non_persistent_topics().iter().map(|topic| topic.history_sample()));
    let clock = &service.ledgers.clock;
    service.history.lock().record(clock.now(), clock.now_ms(), samples);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};

    fn topic(name: &str, msg_in: u64, backlog: u64) -> TopicSample {
        TopicSample {
            name: name.to_string(),
            counters: Counters { msg_in, bytes_in: msg_in * 10, ..Default::default() },
            backlog,
            ..Default::default()
        }
    }

    #[test]
    fn rates_come_from_deltas_between_samples_and_totals_add_up() {
        let start = ManualClock::new(0).now();
        let mut history = History::new(10, 10);
        history.record(start, 1_000, vec![topic("a", 100, 5), topic("b", 0, 1)]);
        let later = start + Duration::from_secs(2);
        history.record(later, 3_000, vec![topic("a", 120, 7), topic("b", 10, 1)]);
        let totals = history.totals().points;
        assert_eq!(totals.len(), 2);
        // The first sample is the baseline: gauges, but no rates yet.
        assert_eq!((totals[0].msg_rate_in, totals[0].msg_backlog, totals[0].topics), (0.0, 6, 2));
        assert_eq!(totals[1].msg_rate_in, 15.0);
        assert_eq!(totals[1].msg_throughput_in, 150.0);
        assert_eq!((totals[1].time_ms, totals[1].msg_backlog), (3_000, 8));
        assert_eq!(history.topic("a").points[1].msg_rate_in, 10.0);
        assert_eq!(history.topic("a").topic.as_deref(), Some("a"));
    }

    #[test]
    fn a_topic_loaded_again_counts_from_zero() {
        let start = ManualClock::new(0).now();
        let mut history = History::new(10, 10);
        history.record(start, 0, vec![topic("a", 100, 0)]);
        // Unloaded and loaded again between two samples: its counter restarted.
        history.record(start + Duration::from_secs(1), 1_000, vec![topic("a", 4, 0)]);
        // Loaded since the previous sample: all it counted is new.
        history.record(
            start + Duration::from_secs(2),
            2_000,
            vec![topic("a", 6, 0), topic("new", 3, 0)],
        );
        let totals = history.totals().points;
        assert_eq!(totals[1].msg_rate_in, 4.0);
        assert_eq!(totals[2].msg_rate_in, 5.0);
    }

    #[test]
    fn series_are_bounded_and_oldest_first() {
        let start = ManualClock::new(0).now();
        let mut history = History::new(3, 10);
        for i in 0..7u64 {
            history.record(start + Duration::from_secs(i), i * 1_000, vec![topic("a", i, i)]);
        }
        let times: Vec<u64> = history.totals().points.iter().map(|p| p.time_ms).collect();
        assert_eq!(times, vec![4_000, 5_000, 6_000]);
        let backlog: Vec<u64> = history.topic("a").points.iter().map(|p| p.msg_backlog).collect();
        assert_eq!(backlog, vec![4, 5, 6]);
        assert_eq!(history.totals().capacity, 3);
    }

    #[test]
    fn topic_slots_are_bounded_and_go_to_active_topics() {
        let start = ManualClock::new(0).now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut history = History::new(5, 2);
        history.record(at(0), 0, vec![topic("idle-1", 0, 0), topic("idle-2", 0, 0)]);
        history.record(at(1), 1_000, vec![topic("idle-1", 0, 0), topic("idle-2", 0, 0)]);
        assert_eq!(history.topic_series(), 2);
        // An idle newcomer finds no slot; an active one takes an idle topic's.
        let samples = vec![
            topic("idle-1", 0, 0),
            topic("idle-2", 0, 0),
            topic("quiet", 0, 0),
            topic("busy", 5, 0),
        ];
        history.record(at(2), 2_000, samples);
        assert_eq!(history.topic_series(), 2);
        assert!(history.topic("quiet").points.is_empty());
        assert_eq!(history.topic("busy").points.len(), 1);
        // A topic no longer loaded loses its series.
        history.record(at(3), 3_000, vec![topic("busy", 10, 0)]);
        assert_eq!(history.topic_series(), 1);
        assert_eq!(history.topic("busy").points.len(), 2);
        assert!(history.topic("nothing").points.is_empty());
    }

    #[test]
    fn serialises_with_pulsar_style_names() {
        let mut history = History::new(2, 2);
        history.record(ManualClock::new(0).now(), 5, vec![topic("a", 1, 2)]);
        let json = serde_json::to_value(history.totals()).unwrap();
        assert_eq!(json["intervalMs"], 2000);
        assert_eq!(json["points"][0]["msgBacklog"], 2);
        assert_eq!(json["points"][0]["timeMs"], 5);
        assert!(json.get("topic").is_none());
    }
}
