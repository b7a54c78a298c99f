//! The prefix cache: full blocks registered under their chained hashes, looked up on
//! admission (a hit shares the blocks), kept after their sequence ends until the eviction
//! policy gives them up for a new block.

use super::*;

impl BlockManager {
    /// Cached blocks currently free (evictable).
    pub(super) fn num_evictable(&self) -> u32 {
        self.policy.as_ref().map_or(0, |p| p.len() as u32)
    }

    /// Takes a free block: an uncached one first, else the policy's victim (its hash leaves
    /// the cache).
    pub(super) fn take_block(&mut self) -> Option<u32> {
        if self.extents.is_some() {
            return self.take_run(1, None)?.pop();
        }
        let b = match self.free_queue.pop_front() {
            Some(b) => b,
            None => {
                let b = self.policy.as_mut()?.pop_victim()?;
                if let Some(h) = self.hashes[b as usize].take() {
                    self.cached.remove(&h);
                    if let Some(t) = self.offload.as_mut() {
                        if t.store_mode() == super::offload::OffloadStore::OnEvict {
                            t.put(h);
                        }
                    }
                }
                self.evictions += 1;
                b
            }
        };
        self.ref_counts[b as usize] = 1;
        self.used += 1;
        Some(b)
    }

    /// Number of leading `hashes` present in the prefix cache, and how many of those blocks
    /// are currently free (taking them back uses up free blocks).
    pub(super) fn lookup(&self, hashes: &[u64]) -> (u32, u32) {
        let (mut n, mut free) = (0, 0);
        for h in hashes {
            match self.cached.get(h) {
                Some(&b) => {
                    n += 1;
                    if self.ref_counts[b as usize] == 0 {
                        free += 1;
                    }
                }
                None => break,
            }
        }
        (n, free)
    }

    /// Leading cached blocks a sequence with `hashes` can use (the main table's hits, cut
    /// back to what the side groups hold cached), and how many of those are free.
    pub(super) fn prefix_hits(&self, hashes: &[u64]) -> (u32, u32) {
        let (hits, free) = self.lookup(hashes);
        if self.side.is_empty() {
            return (hits, free);
        }
        let hits = self.side_hit_limit(hashes, hits);
        let free = hashes[..hits as usize]
            .iter()
            .filter(|h| self.ref_counts[self.cached[*h] as usize] == 0)
            .count() as u32;
        (hits, free)
    }

    /// Registers newly full blocks of sequences in the prefix cache (a hash already cached
    /// by another block leaves this one uncached: the first copy wins).
    pub fn cache_blocks(&mut self, blocks: &[CacheBlocks]) {
        if self.policy.is_none() {
            return;
        }
        for c in blocks {
            self.cache_side_blocks(c);
            let Some(policy) = self.policy.as_mut() else {
                return;
            };
            let Some(table) = self.tables.get(&c.seq) else {
                continue;
            };
            for (i, &h) in c.hashes.iter().enumerate() {
                let Some(&b) = table.get(c.first as usize + i) else {
                    break;
                };
                if b == NULL_BLOCK {
                    continue;
                }
                if self.hashes[b as usize].is_none() && !self.cached.contains_key(&h) {
                    self.hashes[b as usize] = Some(h);
                    self.cached.insert(h, b);
                    policy.on_cached(b, h, self.tick);
                    if let Some(t) = self.offload.as_mut() {
                        if t.store_mode() == super::offload::OffloadStore::WriteThrough {
                            t.put(h);
                        }
                    }
                }
            }
        }
    }

    /// Admits a sequence without blocks through the prefix cache: takes back the cached
    /// blocks of its leading `hashes` and grows the table to `slots(hit_tokens)`. Returns the
    /// hit tokens, or `None` (and no change) if the blocks do not fit.
    pub(super) fn admit_with_prefix(
        &mut self,
        seq: SeqId,
        hashes: &[u64],
        slots: impl Fn(u32) -> u32,
    ) -> Option<u32> {
        let (hits, hits_free) = self.prefix_hits(hashes);
        let loads = self.offload_hits(hashes, hits);
        let hit = (hits + loads) * self.block_size;
        let slots = slots(hit);
        let want = self.blocks_for(slots).max(hits + loads);
        let (side_hits, side, side_free) = self.side_admission(seq, hashes, hits, slots);
        if want - hits + side > self.num_free().saturating_sub(hits_free + side_free) {
            return None;
        }
        let mut table = Vec::with_capacity(want as usize);
        for h in &hashes[..hits as usize] {
            let b = self.cached[h];
            self.take_cached(b);
            table.push(b);
        }
        // The side groups' hits are taken back before any fresh block can evict them.
        self.take_side_hits(seq, side_hits);
        // The tier's hits are read (and refreshed there) before a fresh block's eviction
        // can store into the tier; they fill fresh blocks over PCIe (the step's
        // `offload_loads`).
        if loads > 0 {
            if let Some(t) = self.offload.as_mut() {
                let prefix = &hashes[hits as usize..(hits + loads) as usize];
                let mut from_disk = 0;
                for &h in prefix {
                    let served = t.load(h);
                    debug_assert!(served.is_some(), "a counted offload hit is held");
                    if served == Some(super::offload::Served::Disk) {
                        from_disk += 1;
                    }
                }
                // Disk hits move up to the CPU tier once the whole prefix is read.
                if from_disk > 0 {
                    for &h in prefix {
                        if !t.contains(h) {
                            t.promote(h);
                        }
                    }
                }
                self.disk_loads += from_disk;
            }
            self.offload_loads += loads;
        }
        for _ in hits..want {
            table.push(self.take_block()?);
        }
        // Loaded blocks hold their prefix's KV: they join the GPU cache (the scheduler
        // counts them computed and registers only the blocks after them).
        for (i, &h) in hashes[hits as usize..(hits + loads) as usize]
            .iter()
            .enumerate()
        {
            let b = table[hits as usize + i];
            if self.hashes[b as usize].is_none() && !self.cached.contains_key(&h) {
                self.hashes[b as usize] = Some(h);
                self.cached.insert(h, b);
                if let Some(p) = self.policy.as_mut() {
                    p.on_cached(b, h, self.tick);
                }
            }
        }
        self.tables.insert(seq, table);
        self.grow_side(seq, slots, hit, &mut Vec::new());
        Some(hit)
    }

    /// The leading blocks of `hashes` past the GPU's `hits` that the offload tiers hold
    /// (none with side groups: their per-layer-group pages are not offloaded).
    pub(super) fn offload_hits(&self, hashes: &[u64], hits: u32) -> u32 {
        match &self.offload {
            Some(t) if self.side.is_empty() => t.leading(&hashes[hits as usize..]),
            _ => 0,
        }
    }

    /// Takes a reference to cached block `b` for a prefix hit (out of the evictable set if
    /// nobody held it).
    pub(super) fn take_cached(&mut self, b: u32) {
        let rc = &mut self.ref_counts[b as usize];
        if *rc == 0 {
            if let Some(p) = self.policy.as_mut() {
                p.on_unevictable(b);
            }
            self.used += 1;
        }
        *rc += 1;
        if let Some(p) = self.policy.as_mut() {
            p.on_hit(b, self.tick);
        }
    }

    /// The hashes a waiting entry looks up in the prefix cache (`None`: no lookup). A full
    /// hit still recomputes the last token, so the block holding it is never looked up.
    pub(super) fn usable_hashes<'e>(&self, e: &'e ReserveEntry) -> Option<&'e [u64]> {
        let hashes = e.hashes.as_deref()?;
        if self.policy.is_none() || self.tables.contains_key(&e.seq) {
            return None;
        }
        let usable = (e.total.saturating_sub(1) / self.block_size) as usize;
        Some(&hashes[..hashes.len().min(usable)])
    }
}
