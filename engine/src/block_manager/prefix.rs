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

    /// Registers newly full blocks of sequences in the prefix cache (a hash already cached
    /// by another block leaves this one uncached: the first copy wins).
    pub fn cache_blocks(&mut self, blocks: &[CacheBlocks]) {
        let Some(policy) = self.policy.as_mut() else {
            return;
        };
        for c in blocks {
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
        let (hits, hits_free) = self.lookup(hashes);
        let want = self.blocks_for(slots(hits * self.block_size)).max(hits);
        if want - hits > self.num_free() - hits_free {
            return None;
        }
        let mut table = Vec::with_capacity(want as usize);
        for h in &hashes[..hits as usize] {
            let b = self.cached[h];
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
            table.push(b);
        }
        for _ in hits..want {
            table.push(self.take_block()?);
        }
        self.tables.insert(seq, table);
        Some(hits * self.block_size)
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
