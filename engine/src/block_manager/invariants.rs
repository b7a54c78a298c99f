//! The pool's invariants (DESIGN §3): block state counts, reference counts against the
//! block tables, the prefix cache's hashes; checked by the property tests after every step.

use super::*;

impl BlockManager {
    /// Block state counts.
    pub fn counts(&self) -> BlockCounts {
        BlockCounts {
            free_uncached: self.free_queue.len() as u32 + self.extent_free,
            free_cached: self.num_evictable(),
            in_use: self.used,
        }
    }

    /// Checks DESIGN §3 invariants 1 and 2; returns a description of the first violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        if let Some(t) = &self.offload {
            let st = t.stats();
            if st.blocks > st.capacity {
                return Err(format!(
                    "offload tier holds {} blocks, more than its {}",
                    st.blocks, st.capacity
                ));
            }
            if st.disk_blocks > st.disk_capacity {
                return Err(format!(
                    "disk tier holds {} blocks, more than its {}",
                    st.disk_blocks, st.disk_capacity
                ));
            }
        }
        let c = self.counts();
        if c.free_uncached + c.free_cached + c.in_use != self.num_blocks() {
            return Err(format!(
                "block counts {c:?} do not sum to the pool size {}",
                self.num_blocks()
            ));
        }
        let mut holders = vec![0u32; self.ref_counts.len()];
        for table in self
            .tables
            .values()
            .chain(self.side_tables.values().flatten())
        {
            for &b in table.iter().filter(|&&b| b != NULL_BLOCK) {
                holders[b as usize] += 1;
            }
        }
        let mut in_use = 0;
        for (b, (&rc, &h)) in self.ref_counts.iter().zip(&holders).enumerate() {
            if rc != h {
                return Err(format!("block {b}: ref count {rc} but held by {h} tables"));
            }
            if rc > 0 {
                in_use += 1;
            }
        }
        if in_use != self.used {
            return Err(format!(
                "{in_use} blocks have ref count > 0 but {} counted in use",
                self.used
            ));
        }
        let mut seen = vec![false; self.ref_counts.len()];
        if let Some(extents) = &self.extents {
            let mut total = 0;
            let mut prev_end = None;
            for (&s, &l) in extents {
                if l == 0 || prev_end.is_some_and(|e| e >= s) {
                    return Err(format!("free extent {s}+{l} is empty, overlaps or touches"));
                }
                for b in s..s + l {
                    if self.ref_counts.get(b as usize) != Some(&0) {
                        return Err(format!("block {b} is in a free extent while in use"));
                    }
                    seen[b as usize] = true;
                }
                total += l;
                prev_end = Some(s + l);
            }
            if total != self.extent_free {
                return Err(format!(
                    "extents hold {total} blocks but {} are counted free",
                    self.extent_free
                ));
            }
        }
        for &b in &self.free_queue {
            if self.ref_counts[b as usize] != 0 || seen[b as usize] {
                return Err(format!(
                    "block {b} is in the free queue twice or while in use"
                ));
            }
            if self.hashes[b as usize].is_some() {
                return Err(format!(
                    "block {b} is in the uncached free queue with a hash"
                ));
            }
            seen[b as usize] = true;
        }
        // Invariant 3: the cache maps each hash to one block holding exactly that hash.
        for (h, &b) in &self.cached {
            if self.hashes[b as usize] != Some(*h) {
                return Err(format!(
                    "cache entry {h:#x} points at block {b} holding {:?}",
                    self.hashes[b as usize]
                ));
            }
        }
        if let Some(cpu) = &self.cpu {
            let mut seen = vec![false; cpu.size as usize];
            let swapped = cpu.tables.values().flatten().filter(|&&b| b != NULL_BLOCK);
            for &b in cpu.free.iter().chain(swapped) {
                if b >= cpu.size || std::mem::replace(&mut seen[b as usize], true) {
                    return Err(format!("CPU block {b} is free or swapped twice"));
                }
            }
            if seen.iter().any(|s| !s) {
                return Err("a CPU block is neither free nor swapped".into());
            }
            if let Some(s) = cpu.tables.keys().find(|s| self.tables.contains_key(s)) {
                return Err(format!(
                    "sequence {s} holds both GPU and swapped CPU blocks"
                ));
            }
        }
        self.check_side()?;
        let hashed = self.hashes.iter().filter(|h| h.is_some()).count();
        if hashed != self.cached.len() {
            return Err(format!(
                "{hashed} blocks hold hashes but the cache has {} entries",
                self.cached.len()
            ));
        }
        Ok(())
    }
}
