//! Hybrid layouts (vLLM's hybrid KV cache manager): models whose layers keep different
//! caches get one block table per *group* of layers, all drawing pages from the one pool.
//!
//! The main table (`tables`) belongs to the full-attention group; [`SideGroup`]s sit beside
//! it: sliding-window layers, whose pages wholly before the window are freed as the
//! sequence advances (gpt-oss, Gemma's local layers), and linear-attention or Mamba layers,
//! which hold a fixed state of a few pages per sequence whatever its length (Qwen3-Next,
//! Qwen3.5). In flows a reservation's `(seq, slots, write_from)`; out come the pages each
//! side table needs, takes or frees, with the same copy-on-write, prefix-cache and
//! rollback rules as the main table. A sliding group caches its full pages under its own
//! keys, so a prefix hit must also find the window before it cached in every sliding group;
//! a state group keeps no per-position state, so a layout with one gets no prefix hits
//! (vLLM before its Mamba `align` cache mode). Preempted hybrid sequences recompute (vLLM
//! V1 does not swap).

use super::*;

/// One group of layers beside the main (full-attention) table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SideGroup {
    /// Sliding-window attention over `window` tokens: a write from position `p` needs only
    /// positions from `p + 1 - window` on.
    Sliding {
        /// Window in tokens.
        window: u32,
    },
    /// A fixed per-sequence state (linear attention's recurrent and convolution state) of
    /// `pages` pool blocks, written in place every step.
    State {
        /// Pool blocks the state takes.
        pages: u32,
    },
}

impl SideGroup {
    /// Most pages of `block_size` tokens one sequence holds in this group when a step
    /// writes up to `chunk` tokens: the window and the chunk, one more for the block the
    /// window straddles; or the state.
    pub fn max_pages(self, block_size: u32, chunk: u32) -> u32 {
        match self {
            SideGroup::Sliding { window } => window
                .saturating_add(chunk)
                .div_ceil(block_size.max(1))
                .saturating_add(1),
            SideGroup::State { pages } => pages,
        }
    }

    /// Pages one decoding sequence holds in this group (a one-token chunk).
    pub fn decode_pages(self, block_size: u32) -> u32 {
        match self {
            SideGroup::Sliding { window } => window.div_ceil(block_size.max(1)).saturating_add(1),
            SideGroup::State { pages } => pages,
        }
    }
}

/// The most pages one sequence holds in `groups` when a step writes up to `chunk` tokens
/// (what the pool must hold beside the sequence's own blocks).
pub fn max_side_pages(groups: &[SideGroup], block_size: u32, chunk: u32) -> u32 {
    groups
        .iter()
        .map(|g| g.max_pages(block_size, chunk))
        .fold(0u32, u32::saturating_add)
}

/// The prefix-cache key of a page of side group `g` holding the block hashed `h` (side
/// groups cache the same token blocks as the main table, but other layers' KV).
pub(super) fn side_key(h: u64, g: usize) -> u64 {
    h ^ (g as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

impl BlockManager {
    /// Adds side groups: every sequence holding blocks also holds a table per group. Paged
    /// pools only: with the contiguous allocator, single side pages would split the runs.
    pub fn with_side_groups(mut self, groups: Vec<SideGroup>) -> Self {
        self.side = groups
            .into_iter()
            .map(|g| match g {
                SideGroup::Sliding { window } => SideGroup::Sliding {
                    window: window.max(1),
                },
                SideGroup::State { pages } => SideGroup::State {
                    pages: pages.max(1),
                },
            })
            .collect();
        self
    }

    /// The side groups.
    pub fn side_groups(&self) -> &[SideGroup] {
        &self.side
    }

    /// The side tables of `seq`, one per side group (empty if it holds none).
    pub fn side_tables(&self, seq: SeqId) -> &[Vec<u32>] {
        self.side_tables.get(&seq).map_or(&[], Vec::as_slice)
    }

    /// The most pages one sequence's side tables hold at once (the window's pages, one
    /// more for a block the window straddles and one for a chunk's tail, and the states),
    /// for sizing what one sequence of max length needs.
    pub fn max_side_pages(&self, chunk: u32) -> u32 {
        max_side_pages(&self.side, self.block_size, chunk)
    }

    /// First block of a sliding table a write from `write_from` still attends to.
    fn first_live(&self, window: u32, write_from: u32) -> usize {
        ((write_from + 1).saturating_sub(window) / self.block_size) as usize
    }

    /// Frees the pages of `seq`'s sliding side tables wholly before the window of a write
    /// from `write_from` (deepest first).
    pub(super) fn drop_side_outside_window(&mut self, seq: SeqId, write_from: u32) {
        if self.side.is_empty() {
            return;
        }
        let firsts: Vec<Option<usize>> = self
            .side
            .iter()
            .map(|g| match *g {
                SideGroup::Sliding { window } => Some(self.first_live(window, write_from)),
                SideGroup::State { .. } => None,
            })
            .collect();
        let Some(tables) = self.side_tables.get_mut(&seq) else {
            return;
        };
        let mut dropped = Vec::new();
        for (table, first) in tables.iter_mut().zip(firsts) {
            // The freed blocks are a prefix of the table: walk back from the window to
            // the last one freed (a step's cost stays independent of the context).
            let first = first.unwrap_or(0).min(table.len());
            for e in table[..first].iter_mut().rev() {
                if *e == NULL_BLOCK {
                    break;
                }
                dropped.push(*e);
                *e = NULL_BLOCK;
            }
        }
        // Deepest first, as a table is freed.
        for b in dropped {
            self.unref(b);
        }
    }

    /// Pages `seq`'s side tables must take to cover `slots` written from `write_from`:
    /// missing live pages of the sliding groups, the states of a sequence without them,
    /// and private copies of shared pages the step writes (a state is written every step).
    pub(super) fn side_need(&self, seq: SeqId, slots: u32, write_from: u32) -> u32 {
        if self.side.is_empty() {
            return 0;
        }
        let want = self.blocks_for(slots) as usize;
        let tables = self.side_tables.get(&seq);
        let mut need = 0;
        for (g, kind) in self.side.iter().enumerate() {
            let t = tables.map_or(&[][..], |t| t[g].as_slice());
            let shared = |i: usize| t[i] != NULL_BLOCK && self.ref_counts[t[i] as usize] > 1;
            need += match *kind {
                SideGroup::Sliding { window } => {
                    let first = self.first_live(window, write_from);
                    let write = (write_from / self.block_size) as usize;
                    (first..want)
                        .filter(|&i| {
                            i >= t.len() || t[i] == NULL_BLOCK || (i >= write && shared(i))
                        })
                        .count()
                }
                SideGroup::State { pages } => {
                    if t.is_empty() {
                        pages as usize
                    } else {
                        (0..t.len()).filter(|&i| shared(i)).count()
                    }
                }
            };
        }
        need as u32
    }

    /// Takes the pages [`Self::side_need`] counted (the caller checked they are free),
    /// listing copy-on-write copies in `copies`.
    pub(super) fn grow_side(
        &mut self,
        seq: SeqId,
        slots: u32,
        write_from: u32,
        copies: &mut Vec<(u32, u32)>,
    ) {
        if self.side.is_empty() {
            return;
        }
        let want = self.blocks_for(slots) as usize;
        let write = (write_from / self.block_size) as usize;
        let mut tables = self
            .side_tables
            .remove(&seq)
            .unwrap_or_else(|| vec![Vec::new(); self.side.len()]);
        for (g, t) in tables.iter_mut().enumerate() {
            let kind = self.side[g];
            let (live, copy_from) = match kind {
                SideGroup::Sliding { window } => {
                    let first = self.first_live(window, write_from);
                    if t.len() < want {
                        t.resize(want, NULL_BLOCK);
                    }
                    (first..want, write)
                }
                SideGroup::State { pages } => {
                    if t.is_empty() {
                        t.resize(pages as usize, NULL_BLOCK);
                    }
                    (0..t.len(), 0)
                }
            };
            for i in live {
                let b = t[i];
                if b == NULL_BLOCK {
                    let Some(fresh) = self.take_block() else {
                        break;
                    };
                    t[i] = fresh;
                } else if i >= copy_from && self.ref_counts[b as usize] > 1 {
                    let Some(dst) = self.take_block() else { break };
                    // Still held by the other tables (ref count was > 1).
                    self.ref_counts[b as usize] -= 1;
                    t[i] = dst;
                    copies.push((b, dst));
                    self.copy_sources.push(b);
                }
            }
        }
        self.side_tables.insert(seq, tables);
    }

    /// Of `hits` leading cached blocks, how many a hybrid layout can use: every sliding
    /// group must hold cached the window before the first recomputed token, and a state
    /// group has no state cached at a block boundary (no hit).
    pub(super) fn side_hit_limit(&self, hashes: &[u64], hits: u32) -> u32 {
        let mut hits = hits;
        for (g, kind) in self.side.iter().enumerate() {
            match *kind {
                SideGroup::State { .. } => return 0,
                SideGroup::Sliding { window } => {
                    while hits > 0 {
                        let first = self.first_live(window, hits * self.block_size);
                        let cached = (first..hits as usize)
                            .all(|i| self.cached.contains_key(&side_key(hashes[i], g)));
                        if cached {
                            break;
                        }
                        hits -= 1;
                    }
                }
            }
        }
        hits
    }

    /// The side of a prefix admission of `seq` with `hits` cached blocks, growing to
    /// `slots`: the cached side pages it reuses, per group as `(index, block)`, the fresh
    /// pages it takes, and how many reused pages are free (taking them uses up free blocks).
    pub(super) fn side_admission(
        &self,
        seq: SeqId,
        hashes: &[u64],
        hits: u32,
        slots: u32,
    ) -> (Vec<Vec<(usize, u32)>>, u32, u32) {
        let mut free = 0;
        let pages = self
            .side
            .iter()
            .enumerate()
            .map(|(g, kind)| match *kind {
                SideGroup::Sliding { window } if hits > 0 => {
                    let first = self.first_live(window, hits * self.block_size);
                    (first..hits as usize)
                        .filter_map(|i| {
                            let b = *self.cached.get(&side_key(hashes[i], g))?;
                            if self.ref_counts[b as usize] == 0 {
                                free += 1;
                            }
                            Some((i, b))
                        })
                        .collect()
                }
                _ => Vec::new(),
            })
            .collect::<Vec<Vec<(usize, u32)>>>();
        let reused = pages.iter().map(Vec::len).sum::<usize>() as u32;
        let fresh = self
            .side_need(seq, slots, hits * self.block_size)
            .saturating_sub(reused);
        (pages, fresh, free)
    }

    /// Gives `seq` the cached side pages of its prefix hit (taken back from the evictable
    /// set first, so that no fresh page evicts them).
    pub(super) fn take_side_hits(&mut self, seq: SeqId, pages: Vec<Vec<(usize, u32)>>) {
        if self.side.is_empty() {
            return;
        }
        let mut tables = vec![Vec::new(); self.side.len()];
        for (t, group) in tables.iter_mut().zip(pages) {
            for (i, b) in group {
                if t.len() <= i {
                    t.resize(i + 1, NULL_BLOCK);
                }
                self.take_cached(b);
                t[i] = b;
            }
        }
        self.side_tables.insert(seq, tables);
    }

    /// Registers the full pages of `seq`'s sliding side tables at `first..` under their
    /// groups' keys.
    pub(super) fn cache_side_blocks(&mut self, c: &CacheBlocks) {
        let Some(tables) = self.side_tables.get(&c.seq) else {
            return;
        };
        let Some(policy) = self.policy.as_mut() else {
            return;
        };
        for (g, kind) in self.side.iter().enumerate() {
            if !matches!(kind, SideGroup::Sliding { .. }) {
                continue;
            }
            for (i, &h) in c.hashes.iter().enumerate() {
                let Some(&b) = tables[g].get(c.first as usize + i) else {
                    break;
                };
                let key = side_key(h, g);
                if b != NULL_BLOCK
                    && self.hashes[b as usize].is_none()
                    && !self.cached.contains_key(&key)
                {
                    self.hashes[b as usize] = Some(key);
                    self.cached.insert(key, b);
                    policy.on_cached(b, key, self.tick);
                }
            }
        }
    }

    /// Frees `seq`'s side tables, tail first.
    pub(super) fn free_side(&mut self, seq: SeqId) {
        let Some(tables) = self.side_tables.remove(&seq) else {
            return;
        };
        for table in tables.iter().rev() {
            for &b in table.iter().rev().filter(|&&b| b != NULL_BLOCK) {
                self.unref(b);
            }
        }
    }

    /// Forks `child`'s side tables from `parent`'s (every page shared).
    pub(super) fn fork_side(&mut self, parent: SeqId, child: SeqId) {
        let Some(tables) = self.side_tables.get(&parent).cloned() else {
            return;
        };
        for &b in tables.iter().flatten().filter(|&&b| b != NULL_BLOCK) {
            self.ref_counts[b as usize] += 1;
        }
        if let Some(old) = self.side_tables.insert(child, tables) {
            for b in old.into_iter().flatten().filter(|&b| b != NULL_BLOCK) {
                self.unref(b);
            }
        }
    }

    /// Truncates `seq`'s sliding side tables to `keep` blocks (a verify step's rollback).
    pub(super) fn rollback_side(&mut self, seq: SeqId, keep: usize) {
        let Some(tables) = self.side_tables.get_mut(&seq) else {
            return;
        };
        let mut tail = Vec::new();
        for (t, kind) in tables.iter_mut().zip(&self.side) {
            if matches!(kind, SideGroup::Sliding { .. }) && t.len() > keep {
                tail.extend(t.drain(keep..).rev().filter(|&b| b != NULL_BLOCK));
            }
        }
        for b in tail {
            self.unref(b);
        }
    }

    /// Side pages of `seq` only it holds (what preempting it frees).
    pub(super) fn side_private(&self, seq: SeqId) -> u32 {
        self.side_tables(seq)
            .iter()
            .flatten()
            .filter(|&&b| b != NULL_BLOCK && self.ref_counts[b as usize] == 1)
            .count() as u32
    }

    /// Checks the side tables: one per group for exactly the sequences with a main table,
    /// a sliding table as long as the main one, a state of its pages, all live.
    pub(super) fn check_side(&self) -> Result<(), String> {
        if self.side.is_empty() {
            return match self.side_tables.keys().next() {
                Some(s) => Err(format!(
                    "sequence {s} holds side tables without side groups"
                )),
                None => Ok(()),
            };
        }
        if let Some(s) = self
            .side_tables
            .keys()
            .find(|s| !self.tables.contains_key(s))
        {
            return Err(format!("sequence {s} holds side tables but no main table"));
        }
        for (seq, main) in &self.tables {
            let Some(tables) = self.side_tables.get(seq) else {
                return Err(format!(
                    "sequence {seq} holds a main table but no side tables"
                ));
            };
            if tables.len() != self.side.len() {
                return Err(format!(
                    "sequence {seq} holds {} side tables for {} groups",
                    tables.len(),
                    self.side.len()
                ));
            }
            for (g, (t, kind)) in tables.iter().zip(&self.side).enumerate() {
                match *kind {
                    SideGroup::Sliding { .. } if t.len() != main.len() => {
                        return Err(format!(
                            "sequence {seq}: sliding group {g} table has {} blocks, main {}",
                            t.len(),
                            main.len()
                        ));
                    }
                    SideGroup::State { pages }
                        if t.len() != pages as usize || t.contains(&NULL_BLOCK) =>
                    {
                        return Err(format!(
                            "sequence {seq}: state group {g} holds {t:?}, not {pages} pages"
                        ));
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }
}
