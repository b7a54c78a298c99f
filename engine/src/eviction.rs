//! Eviction policies of the prefix cache: which free-but-cached block gives up its content
//! when a new block is needed (DESIGN §5). A policy is one small type implementing
//! [`EvictionPolicy`]; the block manager tells it when blocks are cached, hit, become
//! evictable (ref count 0) or are taken back, and asks it for victims.

use std::collections::BTreeSet;

/// A prefix-cache eviction policy.
pub trait EvictionPolicy: Send + std::fmt::Debug {
    /// Scenario name.
    fn name(&self) -> &'static str;
    /// `block` received content hash `hash` at `tick` (step number).
    fn on_cached(&mut self, block: u32, hash: u64, tick: u64);
    /// Request `seq` was admitted (it has made its prefix-cache lookup).
    fn on_admitted(&mut self, _seq: u64) {}
    /// Request `seq` was preempted (it will look its prefix up again).
    fn on_preempted(&mut self, _seq: u64) {}
    /// `block` was hit by a new sequence at `tick`.
    fn on_hit(&mut self, block: u32, tick: u64);
    /// `block`'s ref count dropped to 0 at `tick`: it becomes an eviction candidate. `order`
    /// grows with every freed block (a table is freed tail first, so at equal `tick` the
    /// deepest block has the smallest order and goes first: vLLM's tie-break).
    fn on_evictable(&mut self, block: u32, tick: u64, order: u64);
    /// An evictable block was taken back by a hit.
    fn on_unevictable(&mut self, block: u32);
    /// Removes and returns the next victim.
    fn pop_victim(&mut self) -> Option<u32>;
    /// Candidates held.
    fn len(&self) -> usize;
    /// True when no block can be evicted.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Candidates ordered by a per-policy key, removable by block.
#[derive(Debug, Default, Clone)]
struct Candidates {
    set: BTreeSet<(u64, u64, u64, u32)>,
    key: Vec<Option<(u64, u64, u64)>>,
}

impl Candidates {
    fn insert(&mut self, block: u32, key: (u64, u64, u64)) {
        let b = block as usize;
        if self.key.len() <= b {
            self.key.resize(b + 1, None);
        }
        if let Some(old) = self.key[b].take() {
            self.set.remove(&(old.0, old.1, old.2, block));
        }
        self.key[b] = Some(key);
        self.set.insert((key.0, key.1, key.2, block));
    }

    fn remove(&mut self, block: u32) {
        if let Some(k) = self.key.get_mut(block as usize).and_then(Option::take) {
            self.set.remove(&(k.0, k.1, k.2, block));
        }
    }

    fn pop(&mut self) -> Option<u32> {
        let first = self.set.pop_first()?;
        self.key[first.3 as usize] = None;
        Some(first.3)
    }
}

/// The three methods every `Candidates`-based policy shares.
macro_rules! candidate_methods {
    () => {
        fn on_unevictable(&mut self, block: u32) {
            self.c.remove(block);
        }
        fn pop_victim(&mut self) -> Option<u32> {
            self.c.pop()
        }
        fn len(&self) -> usize {
            self.c.set.len()
        }
    };
}

fn grow(v: &mut Vec<u64>, b: u32) -> &mut u64 {
    let b = b as usize;
    if v.len() <= b {
        v.resize(b + 1, 0);
    }
    &mut v[b]
}

/// Least recently used (vLLM): the block freed longest ago goes first.
#[derive(Debug, Default, Clone)]
pub struct Lru {
    c: Candidates,
}

impl EvictionPolicy for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }
    fn on_cached(&mut self, _: u32, _: u64, _: u64) {}
    fn on_hit(&mut self, _: u32, _: u64) {}
    fn on_evictable(&mut self, block: u32, tick: u64, order: u64) {
        self.c.insert(block, (tick, order, 0));
    }
    candidate_methods!();
}

/// First in, first out: the block cached earliest goes first, however often it was hit.
#[derive(Debug, Default, Clone)]
pub struct Fifo {
    c: Candidates,
    cached_at: Vec<u64>,
}

impl EvictionPolicy for Fifo {
    fn name(&self) -> &'static str {
        "fifo"
    }
    fn on_cached(&mut self, block: u32, _: u64, tick: u64) {
        *grow(&mut self.cached_at, block) = tick;
    }
    fn on_hit(&mut self, _: u32, _: u64) {}
    fn on_evictable(&mut self, block: u32, _: u64, order: u64) {
        let at = *grow(&mut self.cached_at, block);
        self.c.insert(block, (at, order, 0));
    }
    candidate_methods!();
}

/// Least frequently used: the block with the fewest hits goes first (ties: least recently
/// freed).
#[derive(Debug, Default, Clone)]
pub struct Lfu {
    c: Candidates,
    hits: Vec<u64>,
}

impl EvictionPolicy for Lfu {
    fn name(&self) -> &'static str {
        "lfu"
    }
    fn on_cached(&mut self, block: u32, _: u64, _: u64) {
        *grow(&mut self.hits, block) = 0;
    }
    fn on_hit(&mut self, block: u32, _: u64) {
        *grow(&mut self.hits, block) += 1;
    }
    fn on_evictable(&mut self, block: u32, tick: u64, order: u64) {
        let h = *grow(&mut self.hits, block);
        self.c.insert(block, (h, tick, order));
    }
    candidate_methods!();
}

/// Segmented LRU: blocks never hit since they were cached (the probationary segment) are
/// evicted before blocks that were reused (the protected segment), each segment in LRU
/// order. (No cap on the protected segment: a reused block outranks every unused one.)
#[derive(Debug, Default, Clone)]
pub struct Slru {
    c: Candidates,
    reused: Vec<u64>,
}

impl EvictionPolicy for Slru {
    fn name(&self) -> &'static str {
        "slru"
    }
    fn on_cached(&mut self, block: u32, _: u64, _: u64) {
        *grow(&mut self.reused, block) = 0;
    }
    fn on_hit(&mut self, block: u32, _: u64) {
        *grow(&mut self.reused, block) = 1;
    }
    fn on_evictable(&mut self, block: u32, tick: u64, order: u64) {
        let segment = *grow(&mut self.reused, block);
        self.c.insert(block, (segment, tick, order));
    }
    candidate_methods!();
}

/// Belady's offline rule: evicts the cached block whose next use lies farthest in the
/// future (never used again first). A block is used when a request whose prompt contains it
/// is admitted (its prefix-cache lookup); the oracle knows every request's prompt blocks
/// from the workload ([`Belady::from_requests`]), drops a request from the pending users of
/// its blocks when it is admitted and puts it back when it is preempted, and orders pending
/// users by arrival (the order FCFS admits them). The research upper bound for online
/// policies, not a deployable one.
#[derive(Debug, Default, Clone)]
pub struct Belady {
    /// Hash -> slot in the user lists.
    slot: rustc_hash::FxHashMap<u64, u32>,
    /// User lists, one per slot, concatenated: `users[starts[s]..starts[s + 1]]` are the
    /// dense indices (arrival order) of the requests whose prompt holds the slot's hash.
    starts: Vec<u32>,
    users: Vec<u32>,
    /// Per slot, the position in `users` before which no user is pending (advanced
    /// lazily, rewound when a request is preempted).
    cursor: Vec<u32>,
    /// Requests in arrival order: (arrival, pending, prompt block hashes).
    requests: Vec<(u64, bool, Box<[u64]>)>,
    /// Request id -> dense index.
    index: rustc_hash::FxHashMap<u64, u32>,
    /// Evictable candidate holding each hash.
    candidate: rustc_hash::FxHashMap<u64, u32>,
    hash_of: Vec<u64>,
    /// (next use, u64::MAX - free order, block); the largest is evicted first.
    set: BTreeSet<(u64, u64, u32)>,
    key: Vec<Option<(u64, u64)>>,
}

impl Belady {
    /// An oracle from every request the engine will admit: (id, arrival, prompt length,
    /// prompt block hashes). Only the blocks a lookup can hit count as uses: a lookup never
    /// covers the last prompt token, so a prompt of exactly k blocks can hit k - 1.
    pub fn from_requests(
        block_size: u32,
        requests: impl IntoIterator<Item = (u64, u64, u32, Vec<u64>)>,
    ) -> Self {
        let mut all: Vec<(u64, u64, u32, Vec<u64>)> = requests.into_iter().collect();
        all.sort_by_key(|&(id, arrival, _, _)| (arrival, id));
        let mut b = Belady::default();
        // Two passes over compact lists (a Mooncake replay holds millions of block uses).
        let mut counts: Vec<u32> = Vec::new();
        for (i, (id, arrival, prompt_len, mut hashes)) in all.into_iter().enumerate() {
            let usable = (prompt_len.saturating_sub(1) / block_size.max(1)) as usize;
            hashes.truncate(usable);
            // Chained hashes never repeat within one prompt; guard anyway.
            hashes.dedup();
            for &h in &hashes {
                let next = b.slot.len() as u32;
                let s = *b.slot.entry(h).or_insert(next);
                if s == next {
                    counts.push(0);
                }
                counts[s as usize] += 1;
            }
            b.index.insert(id, i as u32);
            b.requests.push((arrival, true, hashes.into_boxed_slice()));
        }
        b.starts = Vec::with_capacity(counts.len() + 1);
        let mut total = 0u32;
        for &c in &counts {
            b.starts.push(total);
            total += c;
        }
        b.starts.push(total);
        b.cursor = b.starts[..counts.len()].to_vec();
        b.users = vec![0; total as usize];
        let mut fill = b.cursor.clone();
        for (i, (_, _, hashes)) in b.requests.iter().enumerate() {
            for h in hashes.iter() {
                let s = b.slot[h] as usize;
                b.users[fill[s] as usize] = i as u32;
                fill[s] += 1;
            }
        }
        b
    }

    /// Arrival of the first pending user of `hash` (`u64::MAX`: none).
    fn next_use_of(&mut self, hash: u64) -> u64 {
        let Some(&s) = self.slot.get(&hash) else {
            return u64::MAX;
        };
        let (s, end) = (s as usize, self.starts[s as usize + 1]);
        while self.cursor[s] < end {
            let u = self.users[self.cursor[s] as usize];
            match self.requests.get(u as usize) {
                Some(&(arrival, true, _)) => return arrival,
                _ => self.cursor[s] += 1,
            }
        }
        u64::MAX
    }

    /// Arrival of the first pending user of `block`'s content (`u64::MAX`: none).
    fn next_use(&mut self, block: u32) -> u64 {
        let h = self.hash_of.get(block as usize).copied().unwrap_or(0);
        self.next_use_of(h)
    }

    fn insert(&mut self, block: u32, order: u64) {
        let next = self.next_use(block);
        let b = block as usize;
        if self.key.len() <= b {
            self.key.resize(b + 1, None);
        }
        // Among equal next uses the smallest free order goes first (the deepest block of a
        // table freed tail first), so the set holds the inverted order.
        self.key[b] = Some((next, u64::MAX - order));
        self.set.insert((next, u64::MAX - order, block));
    }

    fn remove(&mut self, block: u32) -> Option<u64> {
        let (n, inv) = self.key.get_mut(block as usize).and_then(Option::take)?;
        self.set.remove(&(n, inv, block));
        Some(u64::MAX - inv)
    }

    /// Re-keys the candidate holding `hash`, if any, after its users changed.
    fn rekey(&mut self, hash: u64) {
        if let Some(&b) = self.candidate.get(&hash) {
            if let Some(order) = self.remove(b) {
                self.insert(b, order);
            }
        }
    }

    fn update_users(&mut self, seq: u64, pending: bool) {
        let Some(&i) = self.index.get(&seq) else {
            return;
        };
        let Some(r) = self.requests.get_mut(i as usize) else {
            return;
        };
        if r.1 == pending {
            return;
        }
        r.1 = pending;
        let hashes = r.2.clone();
        for &h in hashes.iter() {
            if pending {
                // Pending again (preempted): the cursor must not have passed it.
                if let Some(&s) = self.slot.get(&h) {
                    let s = s as usize;
                    let (lo, hi) = (self.starts[s] as usize, self.starts[s + 1] as usize);
                    if let Ok(pos) = self.users[lo..hi].binary_search(&i) {
                        self.cursor[s] = self.cursor[s].min((lo + pos) as u32);
                    }
                }
            }
            self.rekey(h);
        }
    }
}

impl EvictionPolicy for Belady {
    fn name(&self) -> &'static str {
        "belady"
    }
    fn on_cached(&mut self, block: u32, hash: u64, _: u64) {
        *grow(&mut self.hash_of, block) = hash;
    }
    fn on_hit(&mut self, _: u32, _: u64) {}
    fn on_evictable(&mut self, block: u32, _: u64, order: u64) {
        let h = self.hash_of.get(block as usize).copied().unwrap_or(0);
        self.candidate.insert(h, block);
        self.insert(block, order);
    }
    fn on_unevictable(&mut self, block: u32) {
        let h = self.hash_of.get(block as usize).copied().unwrap_or(0);
        self.candidate.remove(&h);
        self.remove(block);
    }
    fn on_admitted(&mut self, seq: u64) {
        self.update_users(seq, false);
    }
    fn on_preempted(&mut self, seq: u64) {
        self.update_users(seq, true);
    }
    fn pop_victim(&mut self) -> Option<u32> {
        let (_, _, block) = self.set.pop_last()?;
        self.key[block as usize] = None;
        let h = self.hash_of.get(block as usize).copied().unwrap_or(0);
        self.candidate.remove(&h);
        Some(block)
    }
    fn len(&self) -> usize {
        self.set.len()
    }
}

/// Eviction policies by scenario name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EvictionKind {
    /// [`Lru`].
    Lru,
    /// [`Fifo`].
    Fifo,
    /// [`Lfu`].
    Lfu,
    /// [`Slru`].
    Slru,
    /// [`Belady`] (needs the workload's future; the simulator builds it).
    Belady,
}

impl EvictionKind {
    /// A fresh policy of this kind.
    pub fn policy(self) -> Box<dyn EvictionPolicy> {
        match self {
            EvictionKind::Lru => Box::<Lru>::default(),
            EvictionKind::Fifo => Box::<Fifo>::default(),
            EvictionKind::Lfu => Box::<Lfu>::default(),
            EvictionKind::Slru => Box::<Slru>::default(),
            // Without the future every block looks unused: the runner builds the real
            // oracle with `Belady::from_future`.
            EvictionKind::Belady => Box::<Belady>::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders() {
        // Blocks 1, 2, 3 cached at ticks 0, 1, 2; 3 hit twice, 2 once; freed at 5, 4, 4.
        let mut lru = Lru::default();
        let mut fifo = Fifo::default();
        let mut lfu = Lfu::default();
        let mut slru = Slru::default();
        let policies: [&mut dyn EvictionPolicy; 4] = [&mut lru, &mut fifo, &mut lfu, &mut slru];
        let mut victims = Vec::new();
        for p in policies {
            for (b, t) in [(1, 0), (2, 1), (3, 2)] {
                p.on_cached(b, u64::from(b), t);
            }
            p.on_hit(3, 3);
            p.on_hit(3, 3);
            p.on_hit(2, 3);
            p.on_evictable(1, 5, 10);
            p.on_evictable(3, 4, 11);
            p.on_evictable(2, 4, 12);
            let order: Vec<u32> = std::iter::from_fn(|| p.pop_victim()).collect();
            victims.push(order);
        }
        assert_eq!(victims[0], vec![3, 2, 1]); // LRU: freed at 4 (tail first: 3), then 5
        assert_eq!(victims[1], vec![1, 2, 3]); // FIFO: cached first goes first
        assert_eq!(victims[2], vec![1, 2, 3]); // LFU: 0 hits, 1 hit, 2 hits
        assert_eq!(victims[3], vec![1, 3, 2]); // SLRU: never reused first, then LRU
    }

    #[test]
    fn taken_back_blocks_are_not_victims() {
        let mut p = Lru::default();
        p.on_evictable(7, 1, 1);
        p.on_evictable(8, 1, 2);
        p.on_unevictable(7);
        assert_eq!(p.len(), 1);
        assert_eq!(p.pop_victim(), Some(8));
        assert_eq!(p.pop_victim(), None);
    }
}

#[cfg(test)]
mod belady_tests {
    use super::*;

    #[test]
    fn evicts_the_farthest_next_use() {
        // Requests 1 (t=5) and 2 (t=50) use hash 10; request 3 (t=100) uses 30; nobody 20.
        // Prompts of 5 tokens in blocks of 4: the one full block can be hit.
        let mut p = Belady::from_requests(
            4,
            vec![
                (1, 5, 5, vec![10]),
                (2, 50, 5, vec![10]),
                (3, 100, 5, vec![30]),
            ],
        );
        for (b, h) in [(1, 10), (2, 20), (3, 30)] {
            p.on_cached(b, h, 0);
        }
        p.on_admitted(1);
        for (b, o) in [(1, 0), (2, 1), (3, 2)] {
            p.on_evictable(b, 0, o);
        }
        assert_eq!(p.pop_victim(), Some(2)); // never used again
        assert_eq!(p.pop_victim(), Some(3)); // next use t = 100 (block 1: t = 50)
        p.on_evictable(3, 0, 3);
        p.on_admitted(2); // block 1 now has no pending user
        assert_eq!(p.pop_victim(), Some(1));
        p.on_preempted(2); // ... until request 2 is preempted
        p.on_evictable(1, 0, 4);
        assert_eq!(p.pop_victim(), Some(3));
        assert_eq!(p.pop_victim(), Some(1));
    }
}
