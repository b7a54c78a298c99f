//! The paged KV-cache block manager (vLLM's design).
//!
//! The pool holds `num_blocks` fixed-size blocks of `block_size` token slots. Each sequence
//! owns a block table (logical block i -> physical block id). Blocks carry a reference
//! count so that copy-on-write forks and prefix sharing (later) can share a block; a block
//! with ref count 0 sits in the free queue. Freed blocks are appended to the tail of the
//! free queue and allocation takes from the head, so the queue is already in the order an
//! LRU prefix cache evicts (vLLM V1's `FreeKVCacheBlockQueue`).
//!
//! The scheduler talks to the block manager once per step: a [`ReserveRequest`] lists the
//! sequences it wants to run with the slots each needs; [`BlockManager::reserve`] grants
//! them in order, preempting victims when blocks run out, and answers with a
//! [`ReserveResponse`].

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use crate::request::SeqId;

/// Where a reservation comes from, which decides whether it may preempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A running sequence: if blocks run out, victims are preempted to make room.
    Running,
    /// A waiting (or preempted) sequence asking to be admitted: admitted only if its blocks
    /// fit; the first that does not fit stops admission (FCFS, no skipping).
    Waiting,
}

/// One sequence's reservation in a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReserveEntry {
    /// Sequence id.
    pub seq: SeqId,
    /// Running or waiting.
    pub kind: EntryKind,
    /// Token slots the block table must cover after this step (computed tokens plus this
    /// step's tokens, or more for a worst-case reservation).
    pub slots: u32,
}

/// In which order the block manager considers running and waiting entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReserveOrder {
    /// Running entries first (may preempt), then waiting entries only if nothing was
    /// preempted (vLLM V1, chunked prefill).
    RunningFirst,
    /// Waiting entries first; if any is admitted the step is prefill-only and running
    /// entries are dropped, otherwise running entries are served (vLLM V0 prefill-first).
    WaitingFirstExclusive,
}

/// The scheduler's one message per step to the block manager.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReserveRequest {
    /// Entries in priority order.
    pub entries: Vec<ReserveEntry>,
    /// Preemption candidates, most preferable victim first (vLLM FCFS: newest admitted).
    /// Must include every running sequence that holds blocks.
    pub victims: Vec<SeqId>,
    /// How to order running and waiting entries.
    pub order: ReserveOrder,
    /// Whether the response should carry block tables (for real backends).
    pub want_tables: bool,
}

/// The block manager's answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReserveResponse {
    /// Indices into `ReserveRequest::entries` that were granted, in entry order.
    pub granted: Vec<usize>,
    /// Sequences preempted (their blocks freed), in the order they were preempted.
    pub preempted: Vec<SeqId>,
    /// Block tables of the granted entries (same order as `granted`) when asked for.
    pub tables: Vec<Vec<u32>>,
    /// Blocks in use after the reservation.
    pub blocks_used: u32,
}

/// Counts of the block states (DESIGN §3 invariant 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockCounts {
    /// Free blocks holding no cached content.
    pub free_uncached: u32,
    /// Free blocks holding cached content (evictable); always 0 until prefix caching.
    pub free_cached: u32,
    /// Blocks with ref count >= 1.
    pub in_use: u32,
}

/// The paged block pool and the block tables.
#[derive(Debug, Clone)]
pub struct BlockManager {
    block_size: u32,
    ref_counts: Vec<u32>,
    free_queue: VecDeque<u32>,
    tables: FxHashMap<SeqId, Vec<u32>>,
    used: u32,
}

impl BlockManager {
    /// A pool of `num_blocks` blocks of `block_size` tokens.
    pub fn new(num_blocks: u32, block_size: u32) -> Self {
        assert!(block_size > 0, "block_size must be positive");
        BlockManager {
            block_size,
            ref_counts: vec![0; num_blocks as usize],
            free_queue: (0..num_blocks).collect(),
            tables: FxHashMap::default(),
            used: 0,
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Blocks in the pool.
    pub fn num_blocks(&self) -> u32 {
        self.ref_counts.len() as u32
    }

    /// Free blocks.
    pub fn num_free(&self) -> u32 {
        self.free_queue.len() as u32
    }

    /// Blocks in use.
    pub fn num_used(&self) -> u32 {
        self.used
    }

    /// Blocks needed to hold `tokens` token slots.
    pub fn blocks_for(&self, tokens: u32) -> u32 {
        tokens.div_ceil(self.block_size)
    }

    /// The block table of `seq` (empty if it holds none).
    pub fn table(&self, seq: SeqId) -> &[u32] {
        self.tables.get(&seq).map_or(&[], Vec::as_slice)
    }

    /// Number of sequences holding blocks.
    pub fn num_tables(&self) -> usize {
        self.tables.len()
    }

    /// Grows `seq`'s table to cover `slots` tokens; false (and no change) if the free pool
    /// is too small.
    fn try_grow(&mut self, seq: SeqId, slots: u32) -> bool {
        let have = self.tables.get(&seq).map_or(0, |t| t.len() as u32);
        let want = self.blocks_for(slots);
        if want <= have {
            return true;
        }
        let need = want - have;
        if need > self.num_free() {
            return false;
        }
        let table = self.tables.entry(seq).or_default();
        for _ in 0..need {
            // The queue holds at least `need` blocks: checked above.
            let Some(b) = self.free_queue.pop_front() else {
                break;
            };
            self.ref_counts[b as usize] = 1;
            table.push(b);
        }
        self.used += need;
        true
    }

    /// Releases every block of `seq`, tail first (so that at equal recency the deepest
    /// block is reused first, vLLM's tie-break for prefix caching).
    pub fn free(&mut self, seq: SeqId) {
        if let Some(table) = self.tables.remove(&seq) {
            for &b in table.iter().rev() {
                let rc = &mut self.ref_counts[b as usize];
                *rc -= 1;
                if *rc == 0 {
                    self.free_queue.push_back(b);
                    self.used -= 1;
                }
            }
        }
    }

    /// Frees several sequences (the per-step commit message).
    pub fn free_all(&mut self, seqs: &[SeqId]) {
        for &s in seqs {
            self.free(s);
        }
    }

    /// Serves one step's reservation: grants entries in order, preempting victims when a
    /// running entry does not fit (recompute: the victim's blocks are freed).
    pub fn reserve(&mut self, req: &ReserveRequest) -> ReserveResponse {
        let mut resp = ReserveResponse::default();
        let mut victims = req.victims.iter().copied().peekable();
        let mut preempted: Vec<SeqId> = Vec::new();
        let is_preempted = |p: &[SeqId], s: SeqId| p.contains(&s);

        let running = req
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.kind == EntryKind::Running);
        let waiting = req
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.kind == EntryKind::Waiting);

        let mut serve_running =
            |bm: &mut Self, resp: &mut ReserveResponse, preempted: &mut Vec<SeqId>| {
                for (i, e) in running.clone() {
                    if is_preempted(preempted, e.seq) {
                        continue;
                    }
                    loop {
                        if bm.try_grow(e.seq, e.slots) {
                            resp.granted.push(i);
                            break;
                        }
                        // Skip candidates already preempted this step.
                        let victim = loop {
                            match victims.next() {
                                Some(v) if is_preempted(preempted, v) => continue,
                                other => break other,
                            }
                        };
                        let Some(v) = victim else {
                            // No victim left: this entry cannot run; preempt it.
                            bm.free(e.seq);
                            preempted.push(e.seq);
                            break;
                        };
                        bm.free(v);
                        preempted.push(v);
                        // A victim granted earlier in this step loses its grant.
                        resp.granted.retain(|&g| req.entries[g].seq != v);
                        if v == e.seq {
                            break;
                        }
                    }
                }
            };
        let serve_waiting = |bm: &mut Self, resp: &mut ReserveResponse| {
            for (i, e) in waiting.clone() {
                if !bm.try_grow(e.seq, e.slots) {
                    break;
                }
                resp.granted.push(i);
            }
        };

        match req.order {
            ReserveOrder::RunningFirst => {
                serve_running(self, &mut resp, &mut preempted);
                if preempted.is_empty() {
                    serve_waiting(self, &mut resp);
                }
            }
            ReserveOrder::WaitingFirstExclusive => {
                serve_waiting(self, &mut resp);
                if resp.granted.is_empty() {
                    serve_running(self, &mut resp, &mut preempted);
                }
            }
        }
        resp.granted.sort_unstable();
        if req.want_tables {
            resp.tables = resp
                .granted
                .iter()
                .map(|&g| self.table(req.entries[g].seq).to_vec())
                .collect();
        }
        resp.preempted = preempted;
        resp.blocks_used = self.used;
        resp
    }

    /// Block state counts.
    pub fn counts(&self) -> BlockCounts {
        BlockCounts {
            free_uncached: self.num_free(),
            free_cached: 0,
            in_use: self.used,
        }
    }

    /// Checks DESIGN §3 invariants 1 and 2; returns a description of the first violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        let c = self.counts();
        if c.free_uncached + c.free_cached + c.in_use != self.num_blocks() {
            return Err(format!(
                "block counts {c:?} do not sum to the pool size {}",
                self.num_blocks()
            ));
        }
        let mut holders = vec![0u32; self.ref_counts.len()];
        for table in self.tables.values() {
            for &b in table {
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
        for &b in &self.free_queue {
            if self.ref_counts[b as usize] != 0 || seen[b as usize] {
                return Err(format!(
                    "block {b} is in the free queue twice or while in use"
                ));
            }
            seen[b as usize] = true;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(seq: SeqId, kind: EntryKind, slots: u32) -> ReserveEntry {
        ReserveEntry { seq, kind, slots }
    }

    #[test]
    fn grows_and_frees_tail_first() {
        let mut bm = BlockManager::new(8, 16);
        let req = ReserveRequest {
            entries: vec![entry(1, EntryKind::Waiting, 33)],
            victims: vec![],
            order: ReserveOrder::RunningFirst,
            want_tables: true,
        };
        let r = bm.reserve(&req);
        assert_eq!(r.granted, vec![0]);
        assert_eq!(r.tables, vec![vec![0, 1, 2]]);
        assert_eq!(bm.num_used(), 3);
        bm.free(1);
        assert_eq!(bm.num_used(), 0);
        // Tail first: block 2 was freed first, so it is reused before 1 and 0.
        let tail: Vec<u32> = bm.free_queue.iter().rev().take(3).copied().collect();
        assert_eq!(tail, vec![0, 1, 2]);
        bm.check_invariants().unwrap();
    }

    #[test]
    fn preempts_newest_to_let_older_decode() {
        let mut bm = BlockManager::new(4, 4);
        for s in [1, 2] {
            let r = bm.reserve(&ReserveRequest {
                entries: vec![entry(s, EntryKind::Waiting, 8)],
                victims: vec![],
                order: ReserveOrder::RunningFirst,
                want_tables: false,
            });
            assert_eq!(r.granted, vec![0]);
        }
        assert_eq!(bm.num_free(), 0);
        // Both decode one more token: seq 1 needs a third block, seq 2 (newest) is preempted.
        let r = bm.reserve(&ReserveRequest {
            entries: vec![
                entry(1, EntryKind::Running, 9),
                entry(2, EntryKind::Running, 9),
            ],
            victims: vec![2, 1],
            order: ReserveOrder::RunningFirst,
            want_tables: false,
        });
        assert_eq!(r.granted, vec![0]);
        assert_eq!(r.preempted, vec![2]);
        assert_eq!(bm.table(1).len(), 3);
        assert!(bm.table(2).is_empty());
        bm.check_invariants().unwrap();
    }

    #[test]
    fn waiting_first_exclusive_falls_back_to_decode() {
        let mut bm = BlockManager::new(2, 4);
        bm.reserve(&ReserveRequest {
            entries: vec![entry(1, EntryKind::Waiting, 4)],
            victims: vec![],
            order: ReserveOrder::RunningFirst,
            want_tables: false,
        });
        let r = bm.reserve(&ReserveRequest {
            entries: vec![
                entry(2, EntryKind::Waiting, 8),
                entry(1, EntryKind::Running, 5),
            ],
            victims: vec![1],
            order: ReserveOrder::WaitingFirstExclusive,
            want_tables: false,
        });
        assert_eq!(r.granted, vec![1]);
        assert!(r.preempted.is_empty());
    }
}
