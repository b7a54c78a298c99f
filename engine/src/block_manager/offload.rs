//! A CPU tier under the GPU prefix cache (vLLM's OffloadingConnector, LMCache's CPU
//! backend), and optionally a local-disk tier under it (LMCache's local disk backend):
//! block hashes whose KV also sits in host memory or on disk, so that a prefix evicted
//! from the GPU can be loaded back instead of recomputed.
//!
//! In: the hashes of blocks as they fill (`write-through`) or as the GPU evicts them
//! (`on-evict`), and prefix lookups past the GPU's hits. Out: how many further leading
//! blocks the tiers hold (each becomes a load: a fresh GPU block filled over PCIe, priced
//! by the cost model like a swap-in, after a read from disk for the disk tier's), and the
//! tiers' counters. The disk tier takes the blocks the CPU tier drops, and a block loaded
//! from disk is promoted to the CPU tier. A tier holds hashes only: in simulation the
//! content of a block is its hash. Its capacity is in blocks; which block leaves when it
//! is full is LRU, or ARC (Megiddo and Modha), which keeps blocks hit twice apart from
//! blocks seen once and adapts the split to the trace.

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

/// When a block's KV is written to the tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OffloadStore {
    /// Every block as it fills (vLLM's CPU offloading, LMCache): the copy to host runs
    /// beside the compute, so the tier holds whatever the GPU holds and more.
    #[default]
    WriteThrough,
    /// A block as the GPU evicts it (a victim cache).
    OnEvict,
}

/// Which block the full tier drops.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OffloadPolicy {
    /// Least recently stored or loaded.
    #[default]
    Lru,
    /// Adaptive replacement cache.
    Arc,
}

/// The tiers' counters: the CPU tier's, and the disk tier's (all 0 without one).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffloadStats {
    /// Capacity, blocks.
    pub capacity: u32,
    /// Blocks held at the end.
    pub blocks: u32,
    /// Blocks written to the tier (not counting ones it held already; blocks promoted from
    /// disk included).
    pub stores: u64,
    /// Blocks loaded back to the GPU from this tier (prefix hits in it).
    pub loads: u64,
    /// Blocks dropped because the tier was full (to the disk tier, when there is one).
    pub evictions: u64,
    /// The disk tier's capacity, blocks.
    pub disk_capacity: u32,
    /// Blocks it held at the end.
    pub disk_blocks: u32,
    /// Blocks written to it (the CPU tier's victims it did not hold already).
    pub disk_stores: u64,
    /// Blocks loaded back to the GPU from disk (prefix hits there).
    pub disk_loads: u64,
    /// Blocks it dropped because it was full.
    pub disk_evictions: u64,
}

/// The tier a loaded block came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// Host memory.
    Cpu,
    /// Local disk (then host memory, where it is promoted).
    Disk,
}

/// A recency list of hashes with O(1) insert, remove and pop of the oldest (a linked list
/// in a hash map, keyed by a stamp that only grows).
#[derive(Debug, Default)]
struct Recency {
    stamp: FxHashMap<u64, u64>,
    order: std::collections::BTreeMap<u64, u64>,
    next: u64,
}

impl Recency {
    fn len(&self) -> usize {
        self.stamp.len()
    }
    fn contains(&self, h: u64) -> bool {
        self.stamp.contains_key(&h)
    }
    /// Inserts `h` as the most recent (moving it if present).
    fn touch(&mut self, h: u64) {
        if let Some(old) = self.stamp.insert(h, self.next) {
            self.order.remove(&old);
        }
        self.order.insert(self.next, h);
        self.next += 1;
    }
    fn remove(&mut self, h: u64) -> bool {
        match self.stamp.remove(&h) {
            Some(s) => {
                self.order.remove(&s);
                true
            }
            None => false,
        }
    }
    fn pop_oldest(&mut self) -> Option<u64> {
        let (_, h) = self.order.pop_first()?;
        self.stamp.remove(&h);
        Some(h)
    }
}

/// The tier.
#[derive(Debug)]
pub struct OffloadTier {
    store: OffloadStore,
    policy: OffloadPolicy,
    capacity: usize,
    /// LRU: the whole tier. ARC: T1, blocks seen once.
    t1: Recency,
    /// ARC: T2, blocks seen at least twice.
    t2: Recency,
    /// ARC: ghosts of blocks dropped from T1 and T2 (hashes only, no space).
    b1: Recency,
    b2: Recency,
    /// ARC's target size of T1.
    p: usize,
    stats: OffloadStats,
    /// The tier below, which takes the blocks this one drops (the disk under the CPU).
    lower: Option<Box<OffloadTier>>,
}

impl OffloadTier {
    /// An empty tier of `capacity` blocks.
    pub fn new(capacity: u32, store: OffloadStore, policy: OffloadPolicy) -> Self {
        OffloadTier {
            store,
            policy,
            capacity: capacity as usize,
            t1: Recency::default(),
            t2: Recency::default(),
            b1: Recency::default(),
            b2: Recency::default(),
            p: 0,
            stats: OffloadStats {
                capacity,
                ..OffloadStats::default()
            },
            lower: None,
        }
    }

    /// Puts a tier of `capacity` blocks under this one (the disk under the CPU): it keeps
    /// the blocks this one drops, by its own `policy`.
    pub fn with_lower(mut self, capacity: u32, policy: OffloadPolicy) -> Self {
        if capacity > 0 {
            self.lower = Some(Box::new(OffloadTier::new(
                capacity,
                OffloadStore::OnEvict,
                policy,
            )));
        }
        self
    }

    /// Blocks the tier below holds, and its capacity (`(0, 0)` without one).
    pub fn lower_len(&self) -> (usize, usize) {
        self.lower
            .as_ref()
            .map_or((0, 0), |l| (l.len(), l.capacity))
    }

    /// When blocks are written.
    pub fn store_mode(&self) -> OffloadStore {
        self.store
    }

    /// Whether the tier holds `h`.
    pub fn contains(&self, h: u64) -> bool {
        self.t1.contains(h) || self.t2.contains(h)
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.t1.len() + self.t2.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The counters, the tier below's as `disk_*`.
    pub fn stats(&self) -> OffloadStats {
        let mut s = OffloadStats {
            blocks: self.len() as u32,
            ..self.stats
        };
        if let Some(l) = &self.lower {
            let d = l.stats();
            (
                s.disk_capacity,
                s.disk_blocks,
                s.disk_stores,
                s.disk_loads,
                s.disk_evictions,
            ) = (d.capacity, d.blocks, d.stores, d.loads, d.evictions);
        }
        s
    }

    /// Whether this tier or the one below holds `h`.
    fn holds(&self, h: u64) -> bool {
        self.contains(h) || self.lower.as_ref().is_some_and(|l| l.contains(h))
    }

    /// How many of `hashes`, from the first, this tier or the one below holds.
    pub fn leading(&self, hashes: &[u64]) -> u32 {
        hashes.iter().take_while(|&&h| self.holds(h)).count() as u32
    }

    /// Block `h` was loaded back to the GPU: a hit here, or in the tier below; `None` when
    /// neither holds it (nothing is loaded). A disk hit is promoted here by [`Self::promote`]
    /// once the whole prefix is loaded: promoting it now could push a later block of the
    /// same prefix out of the tier below before its turn.
    pub fn load(&mut self, h: u64) -> Option<Served> {
        if !self.contains(h) {
            let lower = self.lower.as_mut().filter(|l| l.contains(h))?;
            lower.load_here(h);
            return Some(Served::Disk);
        }
        self.load_here(h);
        Some(Served::Cpu)
    }

    /// Writes a block served from the tier below into this one (the block this one drops
    /// goes down).
    pub fn promote(&mut self, h: u64) {
        self.put(h);
    }

    /// A hit on `h`, which this tier holds.
    fn load_here(&mut self, h: u64) {
        self.stats.loads += 1;
        match self.policy {
            OffloadPolicy::Lru => self.t1.touch(h),
            OffloadPolicy::Arc => {
                if self.t1.remove(h) || self.t2.contains(h) {
                    self.t2.touch(h);
                }
            }
        }
    }

    /// Writes block `h` to the tier (a store of a block it holds refreshes it); the block
    /// it drops, if any, goes to the tier below.
    pub fn put(&mut self, h: u64) {
        if let Some(dropped) = self.put_here(h) {
            if let Some(l) = self.lower.as_mut() {
                l.put(dropped);
            }
        }
    }

    /// Writes `h` here; returns the block dropped to make room.
    fn put_here(&mut self, h: u64) -> Option<u64> {
        if self.capacity == 0 {
            return None;
        }
        if self.contains(h) {
            match self.policy {
                OffloadPolicy::Lru => self.t1.touch(h),
                // A second write of the same content is not a reuse: keep its list.
                OffloadPolicy::Arc if self.t1.contains(h) => self.t1.touch(h),
                OffloadPolicy::Arc => self.t2.touch(h),
            }
            return None;
        }
        self.stats.stores += 1;
        match self.policy {
            OffloadPolicy::Lru => {
                let dropped = if self.t1.len() >= self.capacity {
                    self.t1.pop_oldest()
                } else {
                    None
                };
                if dropped.is_some() {
                    self.stats.evictions += 1;
                }
                self.t1.touch(h);
                dropped
            }
            OffloadPolicy::Arc => self.arc_insert(h),
        }
    }

    /// ARC's miss path for `h` (Megiddo and Modha, Fig. 4, cases II-IV); returns the block
    /// dropped from the cache (to a ghost list, or out).
    fn arc_insert(&mut self, h: u64) -> Option<u64> {
        let c = self.capacity;
        if self.b1.contains(h) {
            let delta = (self.b2.len() / self.b1.len().max(1)).max(1);
            self.p = (self.p + delta).min(c);
            let dropped = self.replace(false);
            self.b1.remove(h);
            self.t2.touch(h);
            return dropped;
        }
        if self.b2.contains(h) {
            let delta = (self.b1.len() / self.b2.len().max(1)).max(1);
            self.p = self.p.saturating_sub(delta);
            let dropped = self.replace(true);
            self.b2.remove(h);
            self.t2.touch(h);
            return dropped;
        }
        let l1 = self.t1.len() + self.b1.len();
        let total = l1 + self.t2.len() + self.b2.len();
        let mut dropped = None;
        if l1 >= c {
            if self.t1.len() < c {
                self.b1.pop_oldest();
                dropped = self.replace(false);
            } else {
                dropped = self.t1.pop_oldest();
                if dropped.is_some() {
                    self.stats.evictions += 1;
                }
            }
        } else if total >= c {
            if total >= 2 * c {
                self.b2.pop_oldest();
            }
            dropped = self.replace(false);
        }
        self.t1.touch(h);
        dropped
    }

    /// ARC's REPLACE: frees a place by moving T1's or T2's oldest to its ghost list;
    /// returns the block moved.
    fn replace(&mut self, in_b2: bool) -> Option<u64> {
        if self.len() < self.capacity {
            return None;
        }
        let t1 = self.t1.len();
        let from_t1 = t1 > 0 && (t1 > self.p || (in_b2 && t1 == self.p));
        let moved = if from_t1 {
            self.t1.pop_oldest().inspect(|&h| self.b1.touch(h))
        } else {
            self.t2.pop_oldest().inspect(|&h| self.b2.touch(h))
        };
        if moved.is_some() {
            self.stats.evictions += 1;
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_keeps_the_most_recent_within_capacity() {
        let mut t = OffloadTier::new(3, OffloadStore::WriteThrough, OffloadPolicy::Lru);
        for h in 1..=3 {
            t.put(h);
        }
        t.load(1);
        t.put(4);
        assert!(t.contains(1) && !t.contains(2) && t.contains(4));
        assert_eq!(t.len(), 3);
        assert_eq!(t.leading(&[1, 3, 2, 4]), 2);
        let s = t.stats();
        assert_eq!((s.stores, s.loads, s.evictions, s.blocks), (4, 1, 1, 3));
    }

    #[test]
    fn arc_protects_reused_blocks_from_a_scan() {
        let (mut lru, mut arc) = (
            OffloadTier::new(4, OffloadStore::WriteThrough, OffloadPolicy::Lru),
            OffloadTier::new(4, OffloadStore::WriteThrough, OffloadPolicy::Arc),
        );
        for t in [&mut lru, &mut arc] {
            // Two blocks reused (a shared system prompt), then a long scan of one-offs.
            for h in [1, 2] {
                t.put(h);
                t.load(h);
            }
            for h in 100..120 {
                t.put(h);
            }
            assert!(t.len() <= 4);
        }
        assert!(arc.contains(1) && arc.contains(2), "ARC keeps the reused");
        assert!(
            !lru.contains(1) && !lru.contains(2),
            "LRU lets the scan flush them"
        );
    }

    #[test]
    fn the_disk_keeps_what_the_cpu_drops_and_promotes_what_it_serves() {
        for policy in [OffloadPolicy::Lru, OffloadPolicy::Arc] {
            let mut t =
                OffloadTier::new(2, OffloadStore::WriteThrough, policy).with_lower(3, policy);
            for h in 1..=4 {
                t.put(h);
            }
            // 1 and 2 left the CPU for the disk.
            assert!(!t.contains(1) && !t.contains(2) && t.contains(3) && t.contains(4));
            assert_eq!(t.lower_len(), (2, 3));
            assert_eq!(t.leading(&[1, 2, 3, 4, 9]), 4);
            assert_eq!(t.load(1), Some(Served::Disk), "{policy:?}");
            assert_eq!(t.load(4), Some(Served::Cpu));
            assert_eq!(t.load(9), None);
            assert!(!t.contains(1));
            t.promote(1);
            assert!(t.contains(1), "promoted");
            let s = t.stats();
            assert_eq!((s.loads, s.disk_loads, s.disk_capacity), (1, 1, 3));
            assert_eq!(s.stores, 5, "four puts and the promotion");
            assert!(t.len() <= 2 && t.lower_len().0 <= 3);
            // Every block still held somewhere.
            assert_eq!(t.leading(&[1, 2, 3, 4]), 4);
        }
    }

    #[test]
    fn arc_never_exceeds_capacity() {
        let mut t = OffloadTier::new(8, OffloadStore::OnEvict, OffloadPolicy::Arc);
        let mut x = 7u64;
        for _ in 0..5000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let h = (x >> 33) % 40;
            if x.is_multiple_of(3) && t.contains(h) {
                t.load(h);
            } else {
                t.put(h);
            }
            assert!(t.len() <= 8);
            assert!(t.b1.len() + t.b2.len() + t.len() <= 16);
        }
        let s = t.stats();
        assert_eq!(u64::from(s.blocks) + s.evictions, s.stores);
    }
}
