//! The dispatch state machine (`State::plan` / `State::apply`) driven without tokio or storage:
//! a vector stands for the ledger, and consumers are simulated.

use super::*;
use bytes::BytesMut;
use magnetar_protocol::encode_metadata_and_payload;
use magnetar_protocol::proto::{IntRange, KeySharedMode, MessageMetadata};

struct TestRng(u64);

impl TestRng {
    fn next_u64(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound
    }
}

fn entry(key: Option<&str>, deliver_at: Option<u64>) -> Bytes {
    let metadata = MessageMetadata {
        producer_name: "p".into(),
        partition_key: key.map(str::to_string),
        deliver_at_time: deliver_at.map(|t| t as i64),
        ..Default::default()
    };
    let mut out = BytesMut::new();
    encode_metadata_and_payload(&metadata, b"x", &mut out).expect("encodable");
    out.freeze()
}

/// A topic of one ledger (id 1) and a subscription's dispatch state over it.
struct Model {
    state: State,
    ledger: Vec<(Position, Bytes)>,
    keys: Vec<Option<String>>,
}

impl Model {
    fn new(sub_type: SubType) -> Model {
        Model {
            state: State::new(sub_type, AckState::new(None), None, DispatchSettings::new(100)),
            ledger: Vec::new(),
            keys: Vec::new(),
        }
    }

    fn ledgers(&self) -> LedgerList {
        let mut list = LedgerList::new();
        list.set_entry_count(1, self.ledger.len() as u64);
        list
    }

    fn append(&mut self, key: Option<&str>, deliver_at: Option<u64>) -> Position {
        let position = Position::new(1, self.ledger.len() as u64);
        self.ledger.push((position, entry(key, deliver_at)));
        self.keys.push(key.map(str::to_string));
        position
    }

    fn add(&mut self, key: u64, meta: Option<&KeySharedMeta>) -> Result<(), BrokerError> {
        let (outbox, _receiver) = Outbox::channel();
        let handle = ConsumerHandle {
            key,
            consumer_id: key,
            name: format!("c{key}"),
            priority: 0,
            outbox,
            info: Default::default(),
            read_compacted: false,
        };
        let sub_type = self.state.sub_type;
        self.state.add_consumer(handle, sub_type, meta, "sub")?;
        if matches!(sub_type, SubType::Exclusive | SubType::Failover) {
            self.state.active = Some(key);
        }
        Ok(())
    }

    fn flow(&mut self, key: u64, permits: i64) {
        if let Some(slot) = self.state.consumers.iter_mut().find(|s| s.handle.key == key) {
            slot.permits += permits;
        }
    }

    fn ack(&mut self, position: Position) {
        let ledgers = self.ledgers();
        self.state.ack.ack_individual(position, &ledgers).expect("ack");
        self.state.forget_acked(Some(&[position]));
    }

    /// One dispatch round at time `now`: what went to whom.
    fn round(&mut self, now: u64) -> Option<(Vec<(u64, Position)>, bool)> {
        let ledgers = self.ledgers();
        let plan = self.state.plan(&ledgers, 16, now, None)?;
        let read: Vec<(Position, Bytes)> = match &plan {
            Plan::New(from, count) => {
                self.ledger[from.entry_id as usize..].iter().take(*count).cloned().collect()
            }
            Plan::Redeliver(positions) => {
                positions.iter().map(|p| self.ledger[p.entry_id as usize].clone()).collect()
            }
            Plan::Rescan(_, start) => match start {
                Some(from) => self.ledger[from.entry_id as usize..]
                    .iter()
                    .take(RESCAN_CHUNK)
                    .cloned()
                    .collect(),
                None => Vec::new(),
            },
        };
        let (sent, progress) = self.state.apply(&plan, read, now, -1);
        Some((sent.into_iter().map(|o| (o.consumer, o.position)).collect(), progress))
    }

    /// Rounds until nothing moves (bounded).
    fn settle(&mut self, now: u64) -> Vec<(u64, Position)> {
        let mut all = Vec::new();
        for _ in 0..10_000 {
            match self.round(now) {
                Some((sent, progress)) => {
                    all.extend(sent);
                    if !progress {
                        return all;
                    }
                }
                None => return all,
            }
        }
        panic!("dispatcher did not settle");
    }
}

fn sticky(ranges: &[(i32, i32)]) -> KeySharedMeta {
    KeySharedMeta {
        key_shared_mode: KeySharedMode::Sticky as i32,
        hash_ranges: ranges.iter().map(|&(start, end)| IntRange { start, end }).collect(),
        allow_out_of_order_delivery: None,
    }
}

#[test]
fn each_key_goes_to_one_consumer() {
    let mut model = Model::new(SubType::KeyShared);
    for consumer in 1..=3 {
        model.add(consumer, None).unwrap();
        model.flow(consumer, 1_000);
    }
    for i in 0..300 {
        model.append(Some(&format!("k{}", i % 20)), None);
    }
    let sent = model.settle(0);
    assert_eq!(sent.len(), 300);
    let mut owner: HashMap<String, u64> = HashMap::new();
    for (consumer, position) in &sent {
        let key = model.keys[position.entry_id as usize].clone().unwrap();
        assert_eq!(*owner.entry(key).or_insert(*consumer), *consumer);
    }
    let consumers: HashSet<u64> = owner.values().copied().collect();
    assert!(consumers.len() >= 2, "20 keys over 3 consumers used {consumers:?}");
}

#[test]
fn a_consumer_without_permits_does_not_stall_the_others() {
    let mut model = Model::new(SubType::KeyShared);
    model.add(1, Some(&sticky(&[(0, 32_767)]))).unwrap();
    model.add(2, Some(&sticky(&[(32_768, 65_535)]))).unwrap();
    model.flow(2, 1_000); // consumer 1 has no permits
    let mut for_two = 0;
    for i in 0..200 {
        let key = format!("k{i}");
        if sticky_key_hash(key.as_bytes()) >= 32_768 {
            for_two += 1;
        }
        model.append(Some(&key), None);
    }
    let sent = model.settle(0);
    assert!(sent.iter().all(|(consumer, _)| *consumer == 2));
    assert_eq!(sent.len(), for_two);
    // Consumer 1's keys were parked, in order, and go out once it has permits.
    model.flow(1, 1_000);
    let later = model.settle(0);
    assert_eq!(later.len(), 200 - for_two);
    assert!(later.windows(2).all(|w| w[0].1 < w[1].1));
}

#[test]
fn sticky_overlap_is_refused_with_consumer_assign_error() {
    let mut model = Model::new(SubType::KeyShared);
    model.add(1, Some(&sticky(&[(0, 100)]))).unwrap();
    let error = model.add(2, Some(&sticky(&[(50, 200)]))).unwrap_err();
    assert_eq!(error.server_error(), magnetar_protocol::proto::ServerError::ConsumerAssignError);
    assert_eq!(model.state.consumers.len(), 1);
    // A different mode on the same subscription is refused too.
    assert!(matches!(model.add(3, None), Err(BrokerError::ConsumerBusy(_))));
}

#[test]
fn a_joining_consumer_waits_until_moved_keys_drain() {
    let mut model = Model::new(SubType::KeyShared);
    model.add(1, None).unwrap();
    model.flow(1, 1_000);
    for i in 0..100 {
        model.append(Some(&format!("k{}", i % 10)), None);
    }
    let first = model.settle(0);
    assert_eq!(first.len(), 100);
    model.add(2, None).unwrap();
    model.flow(2, 1_000);
    for i in 100..200 {
        model.append(Some(&format!("k{}", i % 10)), None);
    }
    let second = model.settle(0);
    // Keys that moved to 2 are held back while 1 holds their messages; 1's keys flow.
    assert!(second.iter().all(|(consumer, _)| *consumer == 1));
    assert!(!model.state.redeliver.is_empty(), "some keys must have moved to consumer 2");
    for (_, position) in &first {
        model.ack(*position);
    }
    let third = model.settle(0);
    assert!(third.iter().any(|(consumer, _)| *consumer == 2));
    assert_eq!(second.len() + third.len(), 100);
}

#[test]
fn delayed_messages_wait_for_their_time_on_shared_only() {
    for sub_type in [SubType::Shared, SubType::KeyShared, SubType::Exclusive] {
        let mut model = Model::new(sub_type);
        model.add(1, None).unwrap();
        model.flow(1, 100);
        let delayed = model.append(Some("a"), Some(1_000));
        let plain = model.append(Some("b"), None);
        let sent = model.settle(500);
        if sub_type == SubType::Exclusive {
            assert_eq!(sent, vec![(1, delayed), (1, plain)]);
            continue;
        }
        assert_eq!(sent, vec![(1, plain)], "{sub_type:?}");
        assert_eq!(model.state.delayed.next_wake(), Some(1_000));
        assert!(model.settle(999).is_empty());
        assert_eq!(model.settle(1_000), vec![(1, delayed)]);
    }
}

/// Random joins, leaves, permits, acks and appends; checks at every delivery that each key's
/// earlier messages are acknowledged or held by the same consumer (per-key order), that no
/// message goes out without a permit, and at the end that every message was delivered.
#[test]
fn randomized_joins_and_leaves_keep_per_key_order_and_deliver_everything() {
    for seed in 0..40u64 {
        let mut rng = TestRng(seed);
        let mut model = Model::new(SubType::KeyShared);
        let mut next_consumer = 1u64;
        let mut live: Vec<u64> = Vec::new();
        let mut held: HashMap<u64, Vec<Position>> = HashMap::new();
        let mut acked: HashSet<Position> = HashSet::new();
        let check = |model: &Model,
                     sent: &[(u64, Position)],
                     held: &mut HashMap<u64, Vec<Position>>,
                     acked: &HashSet<Position>| {
            for &(consumer, position) in sent {
                let key = &model.keys[position.entry_id as usize];
                for earlier in 0..position.entry_id {
                    if &model.keys[earlier as usize] != key {
                        continue;
                    }
                    let earlier = Position::new(1, earlier);
                    let at_same = held.get(&consumer).is_some_and(|h| h.contains(&earlier));
                    assert!(
                        acked.contains(&earlier) || at_same,
                        "seed {seed}: {position:?} of {key:?} went to {consumer} before {earlier:?}"
                    );
                }
                held.entry(consumer).or_default().push(position);
            }
        };
        for _step in 0..400 {
            match rng.below(10) {
                0 if live.len() < 4 => {
                    model.add(next_consumer, None).unwrap();
                    live.push(next_consumer);
                    next_consumer += 1;
                }
                1 if !live.is_empty() && rng.below(3) == 0 => {
                    let consumer = live.remove(rng.below(live.len() as u64) as usize);
                    model.state.remove_consumer(consumer);
                    held.remove(&consumer);
                }
                2 | 3 if !live.is_empty() => {
                    let consumer = live[rng.below(live.len() as u64) as usize];
                    model.flow(consumer, rng.below(8) as i64 + 1);
                }
                4 | 5 => {
                    for _ in 0..=rng.below(4) {
                        let key = format!("k{}", rng.below(12));
                        model.append(Some(&key), None);
                    }
                }
                6 | 7 => {
                    // Some consumer acknowledges some of what it holds.
                    if let Some(&consumer) = live.get(rng.below(live.len().max(1) as u64) as usize)
                    {
                        let list = held.entry(consumer).or_default();
                        let mut keep = Vec::new();
                        let taken: Vec<Position> = std::mem::take(list);
                        for position in taken {
                            if rng.below(2) == 0 {
                                acked.insert(position);
                                model.ack(position);
                            } else {
                                keep.push(position);
                            }
                        }
                        *held.entry(consumer).or_default() = keep;
                    }
                }
                _ => {
                    let before: HashMap<u64, i64> =
                        model.state.consumers.iter().map(|s| (s.handle.key, s.permits)).collect();
                    if let Some((sent, _)) = model.round(0) {
                        for (consumer, _) in &sent {
                            assert!(before[consumer] > 0, "seed {seed}: sent without permits");
                        }
                        check(&model, &sent, &mut held, &acked);
                    }
                }
            }
        }
        // Drain: one consumer at least, ample permits, everyone acks everything.
        if live.is_empty() {
            model.add(next_consumer, None).unwrap();
            live.push(next_consumer);
        }
        for _ in 0..200 {
            for &consumer in &live {
                model.flow(consumer, 50);
            }
            let sent = model.settle(0);
            check(&model, &sent, &mut held, &acked);
            for list in held.values_mut() {
                for position in list.drain(..) {
                    acked.insert(position);
                    model.ack(position);
                }
            }
            if acked.len() == model.ledger.len() {
                break;
            }
        }
        assert_eq!(acked.len(), model.ledger.len(), "seed {seed}: not everything was delivered");
    }
}

/// The bounded index through the dispatcher: far more delayed messages than exact entries, so
/// most go through buckets and ledger re-reads; each is delivered once, never before its time.
#[test]
fn delayed_overflow_is_rescanned_from_the_ledger_and_delivered_on_time() {
    // Odd seeds: many messages share a deadline (ties must not livelock a pass).
    for seed in 0..8u64 {
        let mut model = Model::new(SubType::Shared);
        model.state.delayed = DelayTracker::new(DelayConfig {
            exact_capacity: 8,
            bucket_ms: 100,
            max_buckets: 5,
            window_ms: 50,
        });
        model.add(1, None).unwrap();
        model.flow(1, 100_000);
        let mut rng = TestRng(seed);
        let mut due = HashMap::new();
        for i in 0..500u64 {
            if i % 5 == 0 {
                model.append(None, None);
            } else {
                let at = if seed % 2 == 0 { 1 + rng.below(3_000) } else { 1 + rng.below(4) * 700 };
                let position = model.append(Some(&format!("k{i}")), Some(at));
                due.insert(position, at);
            }
        }
        let mut delivered = HashMap::new();
        let mut now = 0;
        while now <= 3_200 {
            for (_, position) in model.settle(now) {
                if let Some(&at) = due.get(&position) {
                    assert!(now >= at, "{position:?} due at {at} sent at {now}");
                }
                assert!(delivered.insert(position, now).is_none(), "{position:?} sent twice");
                model.ack(position);
            }
            assert!(
                model.state.delayed.exact_len() <= 8 && model.state.delayed.bucket_count() <= 5
            );
            now += 10;
        }
        assert_eq!(delivered.len(), 500);
        // Within one tick (10 ms here) of the due time, whatever tier the message went through.
        for (position, at) in &due {
            assert!(
                delivered[position] < at + 10 + 1,
                "{position:?} late: {} for {at}",
                delivered[position]
            );
        }
    }
}

#[test]
fn failover_sends_taken_back_entries_before_a_stream_read_in_flight() {
    let mut model = Model::new(SubType::Failover);
    model.add(1, None).unwrap();
    model.flow(1, 2);
    for _ in 0..4 {
        model.append(None, None);
    }
    let first = model.settle(0);
    assert_eq!(first, vec![(1, Position::new(1, 0)), (1, Position::new(1, 1))]);

    // Consumer 2 takes over with permits; a round reads entries 2 and 3 ...
    model.add(2, None).unwrap();
    model.flow(2, 10);
    model.state.active = Some(2);
    let ledgers = model.ledgers();
    let plan = model.state.plan(&ledgers, 16, 0, None).expect("something to read");
    assert!(matches!(plan, Plan::New(..)));
    let read: Vec<(Position, Bytes)> = model.ledger[2..].to_vec();
    // ... while consumer 1 leaves: entries 0 and 1 come back.
    model.state.remove_consumer(1);
    let (sent, progress) = model.state.apply(&plan, read, 0, -1);
    assert!(sent.is_empty(), "stream entries must not overtake the taken-back ones");
    assert!(progress);
    let order: Vec<Position> = model.settle(0).into_iter().map(|(_, p)| p).collect();
    assert_eq!(order, (0..4).map(|e| Position::new(1, e)).collect::<Vec<_>>());
}

fn limited(max_per_consumer: u32, max_per_subscription: u32) -> Arc<TopicLimits> {
    let limits = TopicLimits::default();
    limits.max_unacked_per_consumer.store(max_per_consumer, Ordering::Relaxed);
    limits.max_unacked_per_subscription.store(max_per_subscription, Ordering::Relaxed);
    Arc::new(limits)
}

#[test]
fn a_shared_consumer_at_max_unacked_gets_nothing_until_back_to_half() {
    let mut model = Model::new(SubType::Shared);
    model.state.limits = limited(4, 0);
    model.add(1, None).unwrap();
    model.flow(1, 100);
    let positions: Vec<Position> = (0..10).map(|_| model.append(None, None)).collect();
    let sent = model.settle(0);
    assert_eq!(sent.len(), 4, "exactly the limit: {sent:?}");
    assert!(model.settle(0).is_empty(), "blocked");
    model.ack(positions[0]);
    assert!(model.settle(0).is_empty(), "3 unacked: above half, still blocked");
    model.ack(positions[1]);
    assert!(model.state.unblocked || !model.state.consumers[0].blocked);
    let more = model.settle(0);
    assert_eq!(
        more.iter().map(|(_, p)| *p).collect::<Vec<_>>(),
        positions[4..6].to_vec(),
        "back to half (2): two more, up to the limit again"
    );
    // A second consumer is not blocked by the first one's unacked messages.
    model.add(2, None).unwrap();
    model.flow(2, 100);
    let second = model.settle(0);
    assert_eq!(second.len(), 4);
    assert!(second.iter().all(|(consumer, _)| *consumer == 2));
}

#[test]
fn a_subscription_at_max_unacked_stops_dispatching_until_back_to_half() {
    let mut model = Model::new(SubType::Shared);
    model.state.limits = limited(0, 6);
    for key in [1, 2] {
        model.add(key, None).unwrap();
        model.flow(key, 100);
    }
    for _ in 0..20 {
        model.append(None, None);
    }
    let sent = model.settle(0);
    assert_eq!(sent.len(), 6);
    assert!(model.settle(0).is_empty());
    for (_, position) in &sent[..3] {
        model.ack(*position);
    }
    assert_eq!(model.settle(0).len(), 3, "resumed at half, up to the limit again");
}

#[test]
fn exclusive_subscriptions_do_not_count_unacked_messages() {
    let mut model = Model::new(SubType::Exclusive);
    model.state.limits = limited(2, 2);
    model.add(1, None).unwrap();
    model.flow(1, 100);
    for _ in 0..10 {
        model.append(None, None);
    }
    assert_eq!(model.settle(0).len(), 10);
}

/// Individual acks forget just the entries they name (no scan of everything pending), and leave
/// the dispatch state exactly as the full scan a cumulative ack does would.
#[test]
fn individual_acks_forget_what_they_name_as_a_full_scan_would() {
    let mut targeted = Model::new(SubType::Shared);
    let mut scanned = Model::new(SubType::Shared);
    for model in [&mut targeted, &mut scanned] {
        model.add(1, None).unwrap();
        model.flow(1, 1_000);
        for _ in 0..60 {
            model.append(None, None);
        }
        assert_eq!(model.settle(0).len(), 60);
        // Half of them taken back for redelivery (counted), then nobody has permits left.
        let back: Vec<Position> = (0..60).step_by(2).map(|e| Position::new(1, e)).collect();
        model.state.requeue(back, true);
        model.state.consumers[0].permits = 0;
    }
    let named: Vec<Position> = (0..60).step_by(3).map(|e| Position::new(1, e)).collect();
    let ledgers = targeted.ledgers();
    for &position in &named {
        targeted.state.ack.ack_individual(position, &ledgers).expect("ack");
        scanned.state.ack.ack_individual(position, &ledgers).expect("ack");
    }
    targeted.state.forget_acked(Some(&named));
    scanned.state.forget_acked(None);
    for model in [&targeted, &scanned] {
        for &position in &named {
            assert!(!model.state.pending.contains_key(&position), "{position} still pending");
            assert!(!model.state.redeliver.contains(&position), "{position} still queued");
            assert!(!model.state.redelivery_counts.contains_key(&position));
        }
        // 60 - 20 acked = 40 left: 20 still pending (odd, not acked), 20 queued (even).
        assert_eq!(model.state.pending.len() + model.state.redeliver.len(), 40);
    }
    let pending = |m: &Model| {
        let mut p: Vec<Position> = m.state.pending.keys().copied().collect();
        p.sort();
        p
    };
    assert_eq!(pending(&targeted), pending(&scanned));
    assert_eq!(targeted.state.redeliver, scanned.state.redeliver);
    assert_eq!(targeted.state.redelivery_counts, scanned.state.redelivery_counts);
}
