//! The waiting queue behind its head. A step reads at most `max_num_seqs + 1` waiting
//! sequences (the seats it can fill and the one that stops it), so the scheduler keeps only
//! that head as sequences in queue order; every other waiting request sits here, in a form
//! from which the next in the queue policy's order is taken without touching the rest:
//! - FCFS and lpm: arrival order (a deque of requests, each still a plain [`Request`]);
//! - priority, sjf and sjf-oracle: ordered sets by the policy's key `(primary, arrival,
//!   id)`. The sjf keys age (the length halves each `queue_aging_s` waited), so entries sit
//!   in one set per number of periods waited (0..=32): within a set the order by
//!   `(len >> periods, arrival, id)` does not change with time, and an entry moves to a
//!   later set when its period ends (at most 32 times, the oldest of a set first).
//!
//! In: arriving requests ([`Backlog::push_arrival`]) and sequences the head gives back
//! ([`Backlog::push_seq`]). Out: the entry with the smallest key at `now`
//! ([`Backlog::peek_key`], [`Backlog::pop`]). Each costs `O(log n)` (plus the moves of
//! entries whose period ended), so a step's cost does not grow with the queue.

use std::collections::{BTreeMap, VecDeque};

use super::policy::{QueueKey, QueuePolicy};
use crate::request::{Nanos, Request, SeqId};

/// Aging periods after which an sjf key is 0 for any 32-bit length (`len >> 32`).
const MAX_PERIODS: usize = 32;

/// What leaves the backlog: a request that only arrived, or a sequence the head gave back
/// (it stays in the scheduler's map of sequences).
#[derive(Debug)]
pub(crate) enum Entry {
    Fresh(Request),
    Seq(SeqId),
}

/// Entries that have waited the same number of aging periods.
#[derive(Debug, Default)]
struct Class {
    /// By key at any time while they stay in this class, with the request of an entry that
    /// only arrived (boxed: most of a long queue; `None` for a sequence given back).
    by_key: BTreeMap<QueueKey, Option<Box<Request>>>,
    /// By arrival and sequence, with each entry's unaged length and request id (to find
    /// those whose period ended; empty when keys do not age).
    by_arrival: BTreeMap<(Nanos, SeqId), (i64, SeqId)>,
}

/// The waiting requests behind the scheduler's head of the queue.
#[derive(Debug)]
pub(crate) struct Backlog {
    policy: QueuePolicy,
    aging_ns: u64,
    /// FCFS and lpm: arrivals in order.
    fifo: VecDeque<Request>,
    /// Keyed policies: one class per periods waited (one class only for priority).
    classes: Vec<Class>,
    len: usize,
    /// The latest time seen (keys are taken at this time).
    now: Nanos,
    /// When the classes were last brought up to date ([`Backlog::advance`]).
    advanced: Nanos,
}

impl Backlog {
    /// An empty backlog for `policy` (`aging_ns`: the sjf aging period).
    pub(crate) fn new(policy: QueuePolicy, aging_ns: u64) -> Self {
        let classes = match policy {
            QueuePolicy::Fcfs | QueuePolicy::Lpm => 0,
            QueuePolicy::Priority => 1,
            QueuePolicy::Sjf | QueuePolicy::SjfOracle => MAX_PERIODS + 1,
        };
        Backlog {
            policy,
            aging_ns: aging_ns.max(1),
            fifo: VecDeque::new(),
            classes: (0..classes).map(|_| Class::default()).collect(),
            len: 0,
            now: 0,
            advanced: 0,
        }
    }

    /// True for the policies whose backlog is kept by key (not in arrival order).
    pub(crate) fn keyed(&self) -> bool {
        !self.classes.is_empty()
    }

    /// Entries waiting here.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// True when nothing waits here.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// An arriving request joins the back (FCFS, lpm) or its place by key.
    pub(crate) fn push_arrival(&mut self, req: Request, now: Nanos) {
        self.len += 1;
        if self.keyed() {
            self.now = self.now.max(now);
            let (id, arrival, base) = (req.id, req.arrival, self.base(&req));
            self.insert((base, arrival, id, id), Some(Box::new(req)));
        } else {
            self.fifo.push_back(req);
        }
    }

    /// Waiting sequence `id` (of request `req`) the head gives back (keyed policies only:
    /// it no longer ranks among the head's).
    /// Takes out the first fresh request `which` picks (first-come queues only; `None`
    /// under a keyed policy or when none matches).
    pub(crate) fn remove_fresh(&mut self, which: impl Fn(&Request) -> bool) -> Option<Request> {
        if self.keyed() {
            return None;
        }
        let i = self.fifo.iter().position(which)?;
        let req = self.fifo.remove(i)?;
        self.len -= 1;
        Some(req)
    }

    pub(crate) fn push_seq(&mut self, id: SeqId, req: &Request, now: Nanos) {
        debug_assert!(self.keyed(), "only keyed backlogs take sequences back");
        self.len += 1;
        self.now = self.now.max(now);
        self.insert((self.base(req), req.arrival, req.id, id), None);
    }

    /// The time keys are taken at: the latest of `now` and the times seen.
    pub(crate) fn latest(&self, now: Nanos) -> Nanos {
        self.now.max(now)
    }

    /// The smallest key at `now` (FCFS, lpm: `None`; their order is the deque's).
    pub(crate) fn peek_key(&mut self, now: Nanos) -> Option<QueueKey> {
        self.advance(now);
        self.classes
            .iter()
            .filter_map(|c| c.by_key.first_key_value().map(|(k, _)| *k))
            .min()
    }

    /// Takes the next entry: the front of the deque, or the smallest key at `now`.
    pub(crate) fn pop(&mut self, now: Nanos) -> Option<Entry> {
        if !self.keyed() {
            let req = self.fifo.pop_front()?;
            self.len -= 1;
            return Some(Entry::Fresh(req));
        }
        let key = self.peek_key(now)?;
        let (_, arrival, _, id) = key;
        let fresh = self.classes.iter_mut().find_map(|c| {
            let fresh = c.by_key.remove(&key)?;
            c.by_arrival.remove(&(arrival, id));
            Some(fresh)
        })?;
        self.len -= 1;
        Some(match fresh {
            Some(req) => Entry::Fresh(*req),
            None => Entry::Seq(id),
        })
    }

    /// The policy's unaged primary key of a request.
    fn base(&self, r: &Request) -> i64 {
        match self.policy {
            QueuePolicy::Priority => i64::from(r.priority),
            QueuePolicy::Sjf => i64::from(r.prompt_len),
            QueuePolicy::SjfOracle => i64::from(r.max_tokens),
            QueuePolicy::Fcfs | QueuePolicy::Lpm => 0,
        }
    }

    /// Aging periods a request that arrived at `arrival` has waited (its class).
    fn periods(&self, arrival: Nanos) -> usize {
        if self.classes.len() == 1 {
            return 0;
        }
        let p = self.now.saturating_sub(arrival) / self.aging_ns;
        p.min(MAX_PERIODS as u64) as usize
    }

    /// Files an entry by its unaged key `(base, arrival, request id, sequence id)`.
    fn insert(&mut self, unaged: QueueKey, fresh: Option<Box<Request>>) {
        let (base, arrival, rid, id) = unaged;
        let ages = self.classes.len() > 1;
        let p = self.periods(arrival);
        let c = &mut self.classes[p];
        c.by_key.insert((base >> p, arrival, rid, id), fresh);
        if ages {
            c.by_arrival.insert((arrival, id), (base, rid));
        }
    }

    /// Moves the entries whose aging period ended by `now` to their class. Inserts place an
    /// entry by the time they are given, so the entries of a class that must move are
    /// always its oldest, and this need only run when time has moved.
    fn advance(&mut self, now: Nanos) {
        self.now = self.now.max(now);
        if self.classes.len() == 1 || self.advanced == self.now {
            return;
        }
        self.advanced = self.now;
        for p in 0..MAX_PERIODS {
            while let Some((&(arrival, id), &(base, rid))) =
                self.classes[p].by_arrival.first_key_value()
            {
                let q = self.periods(arrival);
                if q == p {
                    break;
                }
                let c = &mut self.classes[p];
                c.by_arrival.pop_first();
                let fresh = c.by_key.remove(&(base >> p, arrival, rid, id)).flatten();
                let c = &mut self.classes[q];
                c.by_key.insert((base >> q, arrival, rid, id), fresh);
                c.by_arrival.insert((arrival, id), (base, rid));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Sequence;
    use crate::scheduler::child_id;
    use proptest::prelude::*;

    /// The key the scheduler's full sort would use (the oracle).
    fn oracle(policy: QueuePolicy, (id, r): &(SeqId, Request), now: Nanos, aging: u64) -> QueueKey {
        policy.key(*id, &Sequence::new(r.clone()), now, aging)
    }

    proptest! {
        /// Whatever arrives, is given back (parallel-sampling children included) and is
        /// taken at increasing times, the backlog hands out the smallest key at that time,
        /// as a full sort of the queue would.
        #[test]
        fn pops_the_smallest_key_at_each_time(
            policy in prop_oneof![
                Just(QueuePolicy::Priority),
                Just(QueuePolicy::Sjf),
                Just(QueuePolicy::SjfOracle),
            ],
            aging in prop_oneof![Just(1u64), 1u64..=50, Just(1_000_000)],
            ops in prop::collection::vec((0u64..=40, 0u8..=4, 1u32..=5000, -3i32..=3), 1..120),
        ) {
            let mut b = Backlog::new(policy, aging);
            let mut now = 0;
            let mut next_id = 0;
            // Waiting in the backlog, and taken out of it, as (sequence id, request).
            let mut all: Vec<(SeqId, Request)> = Vec::new();
            let mut held: Vec<(SeqId, Request)> = Vec::new();
            for (dt, op, len, prio) in ops {
                now += dt;
                match op {
                    0 | 1 => {
                        let mut r = Request::new(next_id, now, len, len / 3 + 1);
                        r.priority = prio;
                        next_id += 1;
                        all.push((r.id, r.clone()));
                        b.push_arrival(r, now);
                    }
                    2 => {
                        let want = all.iter().map(|e| oracle(policy, e, now, aging)).min();
                        prop_assert_eq!(b.peek_key(now), want);
                        if let Some(e) = b.pop(now) {
                            let id = match e {
                                Entry::Fresh(r) => r.id,
                                Entry::Seq(id) => id,
                            };
                            let i = all.iter().position(|e| e.0 == id).unwrap();
                            prop_assert_eq!(Some(oracle(policy, &all[i], now, aging)), want);
                            held.push(all.swap_remove(i));
                        }
                    }
                    3 => {
                        if let Some(e) = held.pop() {
                            b.push_seq(e.0, &e.1, now);
                            all.push(e);
                        }
                    }
                    _ => {
                        // A child of a request taken out waits with the same request key.
                        if let Some((_, r)) = held.last() {
                            let child = child_id(r.id, len % 4 + 1);
                            if !all.iter().chain(&held).any(|e| e.0 == child) {
                                b.push_seq(child, r, now);
                                all.push((child, r.clone()));
                            }
                        }
                    }
                }
                prop_assert_eq!(b.len(), all.len());
            }
        }
    }
}
