//! Giving blocks back: finished sequences freed tail first (vLLM's order), copy-on-write
//! forks, verify steps rolled back to their accepted tokens, blocks that fell out of the
//! sliding window.

use super::*;

impl BlockManager {
    /// Frees the blocks of `seq` that a write from `write_from` no longer attends to.
    pub(super) fn drop_outside_window(&mut self, seq: SeqId, write_from: u32) {
        let Some(w) = self.window.filter(|_| self.extents.is_none()) else {
            return;
        };
        let before = ((write_from + 1).saturating_sub(w) / self.block_size) as usize;
        if before == 0 {
            return;
        }
        let Some(table) = self.tables.get_mut(&seq) else {
            return;
        };
        let mut dropped = Vec::new();
        for e in table.iter_mut().take(before) {
            if *e != NULL_BLOCK {
                dropped.push(*e);
                *e = NULL_BLOCK;
            }
        }
        // Deepest first, as a table is freed.
        for b in dropped.into_iter().rev() {
            self.unref(b);
        }
    }

    /// Drops one reference to `b`; a block nobody holds goes back to the pool (after the
    /// reservation if a copy of this step still reads it).
    pub(super) fn unref(&mut self, b: u32) {
        let rc = &mut self.ref_counts[b as usize];
        *rc -= 1;
        if *rc == 0 {
            self.used -= 1;
            if self.copy_sources.contains(&b) {
                self.deferred.push(b);
            } else {
                self.release_block(b);
            }
        }
    }

    /// Forks `child` from `parent` (parallel sampling): the child's table is the parent's,
    /// every block shared (ref count + 1) until one of them writes into it.
    pub fn fork(&mut self, parent: SeqId, child: SeqId) {
        let Some(table) = self.tables.get(&parent).cloned() else {
            return;
        };
        for &b in table.iter().filter(|&&b| b != NULL_BLOCK) {
            self.ref_counts[b as usize] += 1;
        }
        if let Some(old) = self.tables.insert(child, table) {
            // A child id is never reused while live; keep the counts right if it were.
            for b in old.into_iter().filter(|&b| b != NULL_BLOCK) {
                self.unref(b);
            }
        }
        self.fork_side(parent, child);
    }

    /// Forks several children (the per-step commit message).
    pub fn fork_all(&mut self, forks: &[(SeqId, SeqId)]) {
        for &(parent, child) in forks {
            self.fork(parent, child);
        }
    }

    /// Releases every block of `seq`, tail first (so that at equal recency the deepest
    /// block is reused first, vLLM's tie-break for prefix caching).
    pub fn free(&mut self, seq: SeqId) {
        self.lookahead.remove(&seq);
        if let Some(cpu) = self.cpu.as_mut() {
            if let Some(src) = cpu.tables.remove(&seq) {
                cpu.free
                    .extend(src.iter().rev().filter(|&&c| c != NULL_BLOCK));
            }
        }
        self.free_side(seq);
        if let Some(table) = self.tables.remove(&seq) {
            for &b in table.iter().rev() {
                if b != NULL_BLOCK {
                    self.unref(b);
                }
            }
        }
    }

    /// Puts a block whose ref count dropped to 0 back in the free pool.
    pub(super) fn release_block(&mut self, b: u32) {
        if self.extents.is_some() {
            self.release_extent(b);
            return;
        }
        // A cached block stays cached (lazy eviction) as an eviction candidate.
        match (&mut self.policy, self.hashes[b as usize]) {
            (Some(p), Some(_)) => {
                p.on_evictable(b, self.tick, self.free_order);
                self.free_order += 1;
            }
            _ => self.free_queue.push_back(b),
        }
    }

    /// The block manager's side of a step's commit, in its required order: register the
    /// newly full blocks in the prefix cache, roll verify steps back to their verified
    /// tokens (`(sequence, tokens kept)`), fork new sequences (they share their parents'
    /// blocks), then free the finished sequences.
    pub fn release(
        &mut self,
        cache: &[CacheBlocks],
        rollback: &[(SeqId, u32)],
        forks: &[(SeqId, SeqId)],
        free: &[SeqId],
    ) {
        self.cache_blocks(cache);
        for &(seq, tokens) in rollback {
            self.rollback(seq, tokens);
        }
        self.fork_all(forks);
        self.free_all(free);
    }

    /// Speculative decoding: after a verify step of `seq` that kept `tokens` tokens, frees
    /// the blocks this step grew only for lookahead slots that no kept token uses (tail
    /// first). Blocks the sequence held before the step, or would hold without drafts
    /// (a worst-case admission's reservation, the slot of its last token), stay.
    pub fn rollback(&mut self, seq: SeqId, tokens: u32) {
        let Some(first) = self.lookahead.remove(&seq) else {
            return;
        };
        let keep = (self.blocks_for(tokens).max(first)) as usize;
        let Some(table) = self.tables.get_mut(&seq) else {
            return;
        };
        if table.len() <= keep {
            return;
        }
        let tail: Vec<u32> = table.drain(keep..).collect();
        for b in tail.into_iter().rev() {
            if b != NULL_BLOCK {
                self.unref(b);
            }
        }
        self.rollback_side(seq, keep);
    }

    /// Frees several sequences (the per-step commit message).
    pub fn free_all(&mut self, seqs: &[SeqId]) {
        for &s in seqs {
            self.free(s);
        }
    }
}
