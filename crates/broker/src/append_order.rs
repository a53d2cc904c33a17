//! Delivers a managed ledger's append completions in the order the appends were staged, across
//! ledgers.
//!
//! Each ledger completes its own appends in entry order, but two ledgers are independent: after
//! a rollover the new ledger's first appends can be durable before the full ledger's last ones
//! (a replicated ledger has a writer of its own, often on other nodes). Confirmed out of order,
//! a tailing reader would step from the full ledger into the new one past entries not confirmed
//! yet, skipping them for good, and producers would get receipts out of order, which Pulsar
//! clients take for a broken connection (they reconnect and resend everything pending).
//!
//! Pulsar's managed ledger avoids it by starting no append on the next ledger before the full
//! one's last append completed, and so does ours at a rollover (`managed_ledger.rs`: a crash
//! with the next ledger ahead of the full one would store resends after later messages). After
//! a failed ledger the next one starts at once, and this order keeps the receipts in turn.
//!
//! One thread delivers at a time (the delivered callbacks send receipts: two threads delivering
//! could still race on a connection); completions that arrive meanwhile are left to it.

use std::collections::VecDeque;

#[derive(Debug)]
pub(crate) struct AppendOrder<T> {
    /// Ledgers with appends staged and not yet delivered, oldest first.
    ledgers: VecDeque<LedgerAppends<T>>,
    /// A caller is delivering a batch: completions that arrive meanwhile are parked for it.
    delivering: bool,
    /// The last batch's buffer, reused (no allocation per completion).
    spare: Vec<T>,
}

#[derive(Debug)]
struct LedgerAppends<T> {
    ledger: u64,
    /// Staged appends not delivered yet.
    undelivered: u64,
    /// Completed, waiting for the ledgers before this one (in entry order).
    parked: VecDeque<T>,
}

impl<T> Default for AppendOrder<T> {
    fn default() -> Self {
        AppendOrder { ledgers: VecDeque::new(), delivering: false, spare: Vec::new() }
    }
}

impl<T> AppendOrder<T> {
    /// An append was staged on `ledger` (the managed ledger's current one: ids only grow).
    pub fn staged(&mut self, ledger: u64) {
        match self.ledgers.back_mut() {
            Some(last) if last.ledger == ledger => last.undelivered += 1,
            last => {
                assert!(last.is_none_or(|l| l.ledger < ledger), "appends go to newer ledgers only");
                self.ledgers.push_back(LedgerAppends {
                    ledger,
                    undelivered: 1,
                    parked: VecDeque::new(),
                });
            }
        }
    }

    /// `ledger` completed its oldest undelivered append with `outcome`. Returns what the caller
    /// delivers now, in order; after delivering a non-empty batch it calls
    /// [`Self::next_batch`] until that is empty. Empty when another caller is delivering or an
    /// older ledger still has appends to complete.
    pub fn completed(&mut self, ledger: u64, outcome: T) -> Vec<T> {
        let mut ready = std::mem::take(&mut self.spare);
        debug_assert!(ready.is_empty());
        let oldest = self.ledgers.front_mut().expect("a completed append was staged");
        if !self.delivering && oldest.ledger == ledger && oldest.parked.is_empty() {
            // The common case: nothing waits, deliver it at once.
            oldest.undelivered -= 1;
            if oldest.undelivered == 0 {
                self.ledgers.pop_front();
            }
            ready.push(outcome);
            self.delivering = true;
            return ready;
        }
        let appends = self
            .ledgers
            .iter_mut()
            .find(|l| l.ledger == ledger)
            .expect("a completed append was staged");
        appends.parked.push_back(outcome);
        assert!(appends.parked.len() as u64 <= appends.undelivered, "one completion per append");
        if self.delivering {
            self.spare = ready;
            return Vec::new();
        }
        self.take_ready(ready)
    }

    /// After delivering `delivered` (now drained): the next batch, or an empty one, which ends
    /// this caller's turn.
    pub fn next_batch(&mut self, delivered: Vec<T>) -> Vec<T> {
        assert!(self.delivering, "only the delivering caller asks for more");
        assert!(delivered.is_empty(), "a batch is delivered whole");
        self.delivering = false;
        self.take_ready(delivered)
    }

    fn take_ready(&mut self, mut ready: Vec<T>) -> Vec<T> {
        while let Some(oldest) = self.ledgers.front_mut() {
            oldest.undelivered -= oldest.parked.len() as u64;
            ready.extend(oldest.parked.drain(..));
            if oldest.undelivered > 0 {
                break;
            }
            self.ledgers.pop_front();
        }
        if ready.is_empty() {
            self.spare = ready;
            return Vec::new();
        }
        self.delivering = true;
        ready
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Delivers everything a completion makes ready, as the managed ledger does.
    fn complete(
        order: &mut AppendOrder<&'static str>,
        ledger: u64,
        what: &'static str,
    ) -> Vec<&'static str> {
        let mut delivered = Vec::new();
        let mut batch = order.completed(ledger, what);
        while !batch.is_empty() {
            delivered.append(&mut batch);
            batch = order.next_batch(batch);
        }
        delivered
    }

    #[test]
    fn one_ledger_is_delivered_as_it_completes() {
        let mut order = AppendOrder::default();
        order.staged(1);
        order.staged(1);
        assert_eq!(complete(&mut order, 1, "1:0"), ["1:0"]);
        assert_eq!(complete(&mut order, 1, "1:1"), ["1:1"]);
        order.staged(1);
        assert_eq!(complete(&mut order, 1, "1:2"), ["1:2"]);
    }

    #[test]
    fn a_newer_ledger_waits_for_the_older_one_to_finish() {
        let mut order = AppendOrder::default();
        order.staged(1);
        order.staged(1);
        order.staged(4);
        order.staged(4);
        order.staged(7);
        assert_eq!(complete(&mut order, 4, "4:0"), Vec::<&str>::new());
        assert_eq!(complete(&mut order, 7, "7:0"), Vec::<&str>::new());
        assert_eq!(complete(&mut order, 1, "1:0"), ["1:0"]);
        assert_eq!(complete(&mut order, 4, "4:1"), Vec::<&str>::new());
        // The full ledger's last completion releases everything after it.
        assert_eq!(complete(&mut order, 1, "1:1"), ["1:1", "4:0", "4:1", "7:0"]);
        order.staged(7);
        assert_eq!(complete(&mut order, 7, "7:1"), ["7:1"]);
    }

    #[test]
    fn completions_during_a_delivery_are_left_to_the_deliverer() {
        let mut order = AppendOrder::default();
        order.staged(1);
        order.staged(2);
        order.staged(2);
        let mut batch = order.completed(1, "1:0");
        assert_eq!(batch, ["1:0"]);
        // Another thread completes while the first delivers: it gets nothing to deliver.
        assert!(order.completed(2, "2:0").is_empty());
        assert!(order.completed(2, "2:1").is_empty());
        batch.clear();
        let mut batch = order.next_batch(batch);
        assert_eq!(batch, ["2:0", "2:1"]);
        batch.clear();
        assert!(order.next_batch(batch).is_empty());
        // Delivery ended: the next completion is delivered by whoever brings it.
        order.staged(2);
        assert_eq!(complete(&mut order, 2, "2:2"), ["2:2"]);
    }

    #[test]
    #[should_panic(expected = "newer ledgers only")]
    fn staging_on_an_older_ledger_is_a_bug() {
        let mut order = AppendOrder::<()>::default();
        order.staged(5);
        order.staged(3);
    }
}
