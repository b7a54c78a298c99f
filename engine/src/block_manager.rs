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
use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::eviction::EvictionPolicy;
use crate::request::SeqId;

/// A block-table entry whose block was freed because all its tokens fell out of the
/// sliding attention window (the table keeps its logical positions).
pub const NULL_BLOCK: u32 = u32::MAX;

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
    /// Tokens the step computes for this sequence (before any prefix-cache hit).
    pub tokens: u32,
    /// Tokens known for the sequence; a prefix-cache hit never covers the last one (it is
    /// recomputed to produce logits).
    pub total: u32,
    /// Chained hashes of the sequence's full prompt blocks, for a prefix-cache lookup when a
    /// sequence without blocks is admitted (`None`: no lookup).
    pub hashes: Option<Arc<[u64]>>,
    /// First token position the step writes (the sequence's computed tokens): a block from
    /// there on that another table shares is copied first (copy-on-write).
    pub write_from: u32,
    /// Of `slots`, the speculative drafts' lookahead slots: blocks grown only for them are
    /// released again by [`BlockManager::rollback`] when drafts are rejected.
    pub lookahead: u32,
}

/// In which order the block manager considers running and waiting entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReserveOrder {
    /// Running entries first (may preempt), then waiting entries only if nothing was
    /// preempted (vLLM V1, chunked prefill).
    #[default]
    RunningFirst,
    /// Waiting entries first; if any is admitted the step is prefill-only and running
    /// entries are dropped, otherwise running entries are served (vLLM V0 prefill-first).
    WaitingFirstExclusive,
}

/// The scheduler's one message per step to the block manager.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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
    /// Blocks that must stay free after admitting a waiting entry (vLLM V0's watermark;
    /// running sequences may use them).
    pub watermark_blocks: u32,
    /// Running sequences the first waiting entry may preempt when it does not fit, most
    /// preferable first (priority scheduling: those of strictly lower priority). Empty: a
    /// waiting entry never preempts.
    pub priority_victims: Vec<SeqId>,
    /// Waiting sequences whose cached prefix length the scheduler wants to know (the `lpm`
    /// queue policy), with their prompt block hashes; answered after the reservation.
    pub probe: Vec<(SeqId, Arc<[u64]>)>,
}

/// Withdraws the grant of `victim` (preempted after it was granted in this step).
fn revoke(resp: &mut ReserveResponse, req: &ReserveRequest, victim: SeqId) {
    let keep: Vec<bool> = resp
        .granted
        .iter()
        .map(|&g| req.entries[g].seq != victim)
        .collect();
    let mut k = keep.iter();
    resp.hits.retain(|_| *k.next().unwrap_or(&true));
    let mut k = keep.iter();
    resp.granted.retain(|_| *k.next().unwrap_or(&true));
}

/// The block manager's answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReserveResponse {
    /// Indices into `ReserveRequest::entries` that were granted, in entry order.
    pub granted: Vec<usize>,
    /// Sequences preempted (their blocks freed), in the order they were preempted.
    pub preempted: Vec<SeqId>,
    /// Block tables of the granted entries (same order as `granted`) when asked for.
    pub tables: Vec<Vec<u32>>,
    /// Prefix-cache hit tokens of each granted entry (same order as `granted`): the
    /// sequence's computed tokens start there.
    pub hits: Vec<u32>,
    /// Blocks in use after the reservation.
    pub blocks_used: u32,
    /// Cached blocks evicted to make room during this reservation.
    pub evicted: u32,
    /// The preempted sequences whose KV was swapped out to the CPU pool (a subset of
    /// `preempted`; the others lost their KV and will recompute it).
    pub swapped: Vec<SeqId>,
    /// Blocks to copy GPU -> CPU before the step, as `(gpu block, cpu block)`.
    pub swap_out: Vec<(u32, u32)>,
    /// Blocks to copy CPU -> GPU before the step, as `(cpu block, gpu block)`.
    pub swap_in: Vec<(u32, u32)>,
    /// Cached prefix tokens of each probed sequence, after the reservation.
    pub probe_hits: Vec<(SeqId, u32)>,
    /// Copy-on-write copies `(src, dst)`: a shared block a sequence writes into this step.
    pub block_copies: Vec<(u32, u32)>,
    /// External fragmentation after the reservation: `1 - longest free run / free blocks`
    /// (0 for the paged allocator, where any free block will do).
    pub external_fragmentation: f64,
}

/// The CPU swap pool (vLLM's `swap_space`): preempted sequences park their KV here and get
/// it back over PCIe instead of recomputing it.
#[derive(Debug)]
struct CpuPool {
    size: u32,
    free: Vec<u32>,
    tables: FxHashMap<SeqId, Vec<u32>>,
    /// Blocks swapped in during the current reservation: free only after it, so that no
    /// swap-out of the same step (copied first) overwrites them before they are read.
    released: Vec<u32>,
}

/// Newly full blocks of a sequence whose content hashes can now be cached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheBlocks {
    /// Sequence.
    pub seq: SeqId,
    /// Index in the block table of the first block to cache.
    pub first: u32,
    /// Their chained hashes.
    pub hashes: Vec<u64>,
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
///
/// Free blocks are of two kinds: uncached ones (no content worth keeping) in a FIFO queue,
/// used first, and cached ones (a full block whose hash is in the prefix cache) held by the
/// eviction policy until a new block is needed and none is uncached (lazy eviction: a hit
/// takes a cached block back while it is still there).
#[derive(Debug)]
pub struct BlockManager {
    block_size: u32,
    ref_counts: Vec<u32>,
    free_queue: VecDeque<u32>,
    tables: FxHashMap<SeqId, Vec<u32>>,
    used: u32,
    /// Content hash of each block that holds a cached full block.
    hashes: Vec<Option<u64>>,
    /// Prefix cache: hash -> block.
    cached: FxHashMap<u64, u32>,
    /// Eviction policy; `None` disables prefix caching.
    policy: Option<Box<dyn EvictionPolicy>>,
    tick: u64,
    free_order: u64,
    evictions: u64,
    /// CPU swap pool; `None`: preemption always recomputes.
    cpu: Option<CpuPool>,
    /// Sources of this reservation's copy-on-write copies, and those of them freed during
    /// it: held out of the free pool until the reservation ends, so that nothing planned in
    /// the same step overwrites a block a copy still reads.
    copy_sources: Vec<u32>,
    deferred: Vec<u32>,
    /// Sliding attention window in tokens: blocks wholly before it are freed.
    window: Option<u32>,
    /// Free extents `start -> length` of the contiguous allocator (`None`: paged).
    extents: Option<std::collections::BTreeMap<u32, u32>>,
    /// Blocks in `extents`.
    extent_free: u32,
    /// Per sequence verifying drafts this step, the index of its first block grown only
    /// for lookahead slots.
    lookahead: FxHashMap<SeqId, u32>,
}

impl BlockManager {
    /// A pool of `num_blocks` blocks of `block_size` tokens, without prefix caching.
    pub fn new(num_blocks: u32, block_size: u32) -> Self {
        assert!(block_size > 0, "block_size must be positive");
        BlockManager {
            block_size,
            ref_counts: vec![0; num_blocks as usize],
            free_queue: (0..num_blocks).collect(),
            tables: FxHashMap::default(),
            used: 0,
            hashes: vec![None; num_blocks as usize],
            cached: FxHashMap::default(),
            policy: None,
            tick: 0,
            free_order: 0,
            evictions: 0,
            cpu: None,
            copy_sources: Vec::new(),
            deferred: Vec::new(),
            window: None,
            extents: None,
            extent_free: 0,
            lookahead: FxHashMap::default(),
        }
    }

    /// Adds a CPU swap pool of `cpu_blocks` blocks: preempted sequences are swapped out
    /// while it has room for their whole table, and recomputed otherwise.
    pub fn with_swap_space(mut self, cpu_blocks: u32) -> Self {
        self.cpu = Some(CpuPool {
            size: cpu_blocks,
            // Popped from the back: block 0 is used first.
            free: (0..cpu_blocks).rev().collect(),
            tables: FxHashMap::default(),
            released: Vec::new(),
        });
        self
    }

    /// Sliding-window attention over `window` tokens (Mistral's 4096): a sequence writing
    /// from position `p` only needs positions from `p + 1 - window` on, so the blocks wholly
    /// before that are freed (their table entries become [`NULL_BLOCK`]).
    pub fn with_sliding_window(mut self, window: u32) -> Self {
        self.window = Some(window.max(1));
        self
    }

    /// The pre-PagedAttention baseline: each sequence's blocks form one contiguous run of
    /// the pool, taken first-fit when it is admitted and grown only into the blocks right
    /// after it. Free space split into runs too short for a request is external
    /// fragmentation; reserve the whole length at admission (`worst-case` or
    /// `max-model-len` admission) as such allocators did. Prefix caching, swap and sliding
    /// windows are paged-only.
    pub fn with_contiguous_allocation(mut self) -> Self {
        let n = self.free_queue.len() as u32;
        self.free_queue.clear();
        let mut extents = std::collections::BTreeMap::new();
        if n > 0 {
            extents.insert(0, n);
        }
        self.extents = Some(extents);
        self.extent_free = n;
        self
    }

    /// Whether blocks are allocated as contiguous runs.
    pub fn is_contiguous(&self) -> bool {
        self.extents.is_some()
    }

    /// Longest run of free blocks (all free blocks when paged: any of them will do).
    pub fn largest_free_run(&self) -> u32 {
        match &self.extents {
            Some(e) => e.values().copied().max().unwrap_or(0),
            None => self.num_free(),
        }
    }

    /// Takes `n` free blocks as one run: starting right after `after` (growing a run in
    /// place), or first-fit anywhere. `None` (and no change) if no run fits.
    fn take_run(&mut self, n: u32, after: Option<u32>) -> Option<Vec<u32>> {
        let extents = self.extents.as_mut()?;
        let start = match after {
            Some(last) => {
                let s = last.checked_add(1)?;
                (extents.get(&s).copied()? >= n).then_some(s)?
            }
            None => extents.iter().find(|(_, &len)| len >= n).map(|(&s, _)| s)?,
        };
        let len = extents.remove(&start)?;
        if len > n {
            extents.insert(start + n, len - n);
        }
        self.extent_free -= n;
        for b in start..start + n {
            self.ref_counts[b as usize] = 1;
        }
        self.used += n;
        Some((start..start + n).collect())
    }

    /// Returns block `b` to the contiguous allocator's extents, merging neighbours.
    fn release_extent(&mut self, b: u32) {
        let Some(extents) = self.extents.as_mut() else {
            return;
        };
        let (mut start, mut len) = (b, 1);
        if let Some((&s, &l)) = extents.range(..b).next_back() {
            if s + l == b {
                extents.remove(&s);
                start = s;
                len += l;
            }
        }
        if let Some(l) = extents.remove(&(b + 1)) {
            len += l;
        }
        extents.insert(start, len);
        self.extent_free += 1;
    }

    /// Frees the blocks of `seq` that a write from `write_from` no longer attends to.
    fn drop_outside_window(&mut self, seq: SeqId, write_from: u32) {
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
    fn unref(&mut self, b: u32) {
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

    /// Whether preemption swaps to a CPU pool.
    pub fn swaps(&self) -> bool {
        self.cpu.is_some()
    }

    /// CPU blocks holding swapped-out KV.
    pub fn num_swapped_blocks(&self) -> u32 {
        self.cpu
            .as_ref()
            .map_or(0, |c| c.size - c.free.len() as u32)
    }

    /// Whether `seq`'s KV sits in the CPU pool.
    pub fn is_swapped(&self, seq: SeqId) -> bool {
        self.cpu
            .as_ref()
            .is_some_and(|c| c.tables.contains_key(&seq))
    }

    /// Preempts `seq`: swaps its blocks out when the CPU pool has room for all of them
    /// (the copies go in `resp.swap_out`), then frees its GPU blocks. Without room or
    /// without a pool the KV is dropped and the sequence will recompute it.
    fn preempt(&mut self, seq: SeqId, resp: &mut ReserveResponse) {
        self.lookahead.remove(&seq);
        let n = self.table(seq).len();
        // Copy-on-write copies planned for this sequence earlier in the step are dropped:
        // their destination holds nothing yet, so a swap reads the source instead.
        let mut pending: FxHashMap<u32, u32> = FxHashMap::default();
        if !resp.block_copies.is_empty() {
            let table = self.table(seq);
            resp.block_copies.retain(|&(src, dst)| {
                let mine = table.contains(&dst);
                if mine {
                    pending.insert(dst, src);
                }
                !mine
            });
        }
        let mut dst = Vec::new();
        let live = self.table(seq).iter().filter(|&&b| b != NULL_BLOCK).count();
        if let (Some(cpu), Some(table)) = (&mut self.cpu, self.tables.get(&seq)) {
            if live > 0 && live <= cpu.free.len() {
                dst.reserve(n);
                for &g in table {
                    if g == NULL_BLOCK {
                        // Out of the window: nothing to keep.
                        dst.push(NULL_BLOCK);
                        continue;
                    }
                    let Some(c) = cpu.free.pop() else { break };
                    resp.swap_out
                        .push((pending.get(&g).copied().unwrap_or(g), c));
                    dst.push(c);
                }
            }
        }
        self.free(seq);
        let swapped = !dst.is_empty();
        if let (Some(cpu), true) = (&mut self.cpu, swapped) {
            cpu.tables.insert(seq, dst);
        }
        if swapped {
            resp.swapped.push(seq);
        } else if let Some(p) = self.policy.as_mut() {
            // A recomputing sequence will look its prefix up again.
            p.on_preempted(seq);
        }
    }

    /// Swaps `seq` back in: takes GPU blocks for its swapped table, grown to cover `slots`,
    /// and lists the copies in `resp.swap_in`. False (and no change) if they do not fit.
    fn try_swap_in(&mut self, seq: SeqId, slots: u32, resp: &mut ReserveResponse) -> bool {
        let Some(src) = self.cpu.as_ref().and_then(|c| c.tables.get(&seq)) else {
            return false;
        };
        let (n, nulls) = (src.len(), src.iter().filter(|&&c| c == NULL_BLOCK).count());
        let want = (self.blocks_for(slots) as usize).max(n);
        if want - nulls > self.num_free() as usize {
            return false;
        }
        let Some(src) = self.cpu.as_mut().and_then(|c| c.tables.remove(&seq)) else {
            return false;
        };
        let mut table = Vec::with_capacity(want);
        for i in 0..want {
            if src.get(i) == Some(&NULL_BLOCK) {
                table.push(NULL_BLOCK);
                continue;
            }
            // `want - nulls` blocks are free: checked above.
            let Some(b) = self.take_block() else { break };
            if let Some(&c) = src.get(i) {
                resp.swap_in.push((c, b));
            }
            table.push(b);
        }
        if let Some(cpu) = self.cpu.as_mut() {
            cpu.released
                .extend(src.iter().rev().filter(|&&c| c != NULL_BLOCK));
        }
        self.tables.insert(seq, table);
        true
    }

    /// A pool with prefix caching evicting by `policy`.
    pub fn with_prefix_caching(
        num_blocks: u32,
        block_size: u32,
        policy: Box<dyn EvictionPolicy>,
    ) -> Self {
        let mut bm = Self::new(num_blocks, block_size);
        bm.policy = Some(policy);
        bm
    }

    /// Whether prefix caching is on.
    pub fn prefix_caching(&self) -> bool {
        self.policy.is_some()
    }

    /// Cached blocks evicted so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Cached blocks currently free (evictable).
    fn num_evictable(&self) -> u32 {
        self.policy.as_ref().map_or(0, |p| p.len() as u32)
    }

    /// Takes a free block: an uncached one first, else the policy's victim (its hash leaves
    /// the cache).
    fn take_block(&mut self) -> Option<u32> {
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
    fn lookup(&self, hashes: &[u64]) -> (u32, u32) {
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

    /// Tokens per block.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Blocks in the pool.
    pub fn num_blocks(&self) -> u32 {
        self.ref_counts.len() as u32
    }

    /// Free blocks (uncached and evictable cached ones).
    pub fn num_free(&self) -> u32 {
        self.free_queue.len() as u32 + self.extent_free + self.num_evictable()
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

    /// Grows `seq`'s table to cover `slots` tokens, first giving it private copies of the
    /// shared blocks it writes from position `write_from` on (copy-on-write, listed in
    /// `copies`); false (and no change) if the free pool is too small.
    fn try_grow(
        &mut self,
        seq: SeqId,
        slots: u32,
        write_from: u32,
        copies: &mut Vec<(u32, u32)>,
    ) -> bool {
        self.drop_outside_window(seq, write_from);
        let want = self.blocks_for(slots) as usize;
        let first = (write_from / self.block_size) as usize;
        let (have, shared) = match self.tables.get(&seq) {
            Some(t) => {
                let end = want.min(t.len());
                let shared: Vec<usize> = (first.min(end)..end)
                    .filter(|&i| t[i] != NULL_BLOCK && self.ref_counts[t[i] as usize] > 1)
                    .collect();
                (t.len(), shared)
            }
            None => (0, Vec::new()),
        };
        if want <= have && shared.is_empty() {
            return true;
        }
        let need = want.saturating_sub(have) + shared.len();
        if need > self.num_free() as usize {
            return false;
        }
        let mut fresh = Vec::with_capacity(need);
        if self.extents.is_some() && want > have {
            // One run for the growth, right after the table's last block (or anywhere for
            // a new table); copies are single blocks.
            let after = self.tables.get(&seq).and_then(|t| t.last().copied());
            let Some(run) = self.take_run((want - have) as u32, after) else {
                // No room right after it: move the whole sequence to a run that fits
                // (copying every block, as a realloc does), if there is one.
                return have > 0 && self.relocate(seq, want, copies);
            };
            // The run first, so that a copy does not take the block the run needs.
            for _ in 0..shared.len() {
                let Some(b) = self.take_block() else { break };
                fresh.push(b);
            }
            fresh.extend(run);
        } else {
            for _ in 0..need {
                // At least `need` blocks are free: checked above.
                let Some(b) = self.take_block() else {
                    break;
                };
                fresh.push(b);
            }
        }
        let mut fresh = fresh.into_iter();
        let table = self.tables.entry(seq).or_default();
        for i in shared {
            let Some(dst) = fresh.next() else { break };
            let src = table[i];
            // Still held by the other tables (ref count was > 1).
            self.ref_counts[src as usize] -= 1;
            table[i] = dst;
            copies.push((src, dst));
            self.copy_sources.push(src);
        }
        table.extend(fresh);
        true
    }

    /// Contiguous allocator: moves `seq` to a new run of `want` blocks, copying its blocks
    /// there (the old ones are freed once the step's copies have read them). False (and no
    /// change) if no run is long enough.
    fn relocate(&mut self, seq: SeqId, want: usize, copies: &mut Vec<(u32, u32)>) -> bool {
        let Some(run) = self.take_run(want as u32, None) else {
            return false;
        };
        let old = self.tables.insert(seq, run.clone()).unwrap_or_default();
        for (&src, &dst) in old.iter().zip(&run) {
            copies.push((src, dst));
            self.copy_sources.push(src);
        }
        for &b in old.iter().rev() {
            self.unref(b);
        }
        true
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
    }

    /// Forks several children (the per-step commit message).
    pub fn fork_all(&mut self, forks: &[(SeqId, SeqId)]) {
        for &(parent, child) in forks {
            self.fork(parent, child);
        }
    }

    /// Admits a sequence without blocks through the prefix cache: takes back the cached
    /// blocks of its leading `hashes` and grows the table to `slots(hit_tokens)`. Returns the
    /// hit tokens, or `None` (and no change) if the blocks do not fit.
    fn admit_with_prefix(
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
        if let Some(table) = self.tables.remove(&seq) {
            for &b in table.iter().rev() {
                if b != NULL_BLOCK {
                    self.unref(b);
                }
            }
        }
    }

    /// Puts a block whose ref count dropped to 0 back in the free pool.
    fn release_block(&mut self, b: u32) {
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
    }

    /// Frees several sequences (the per-step commit message).
    pub fn free_all(&mut self, seqs: &[SeqId]) {
        for &s in seqs {
            self.free(s);
        }
    }

    /// Admits waiting entry `i` (`e`): through the prefix cache, by swapping it back in, or
    /// with fresh blocks; false (and no change) if it does not fit or would break the
    /// watermark.
    fn try_admit(
        &mut self,
        i: usize,
        e: &ReserveEntry,
        watermark: u32,
        resp: &mut ReserveResponse,
    ) -> bool {
        // Admission keeps `watermark` blocks free, unless nothing holds blocks: then
        // nothing would ever free them (liveness).
        if watermark > 0 && self.used > 0 && self.admission_need(e) + watermark > self.num_free() {
            return false;
        }
        if self.is_swapped(e.seq) {
            // Swapped out: its KV comes back from the CPU pool (no prefix lookup).
            if !self.try_swap_in(e.seq, e.slots, resp) {
                return false;
            }
            resp.granted.push(i);
            resp.hits.push(0);
            return true;
        }
        let hit = match self.usable_hashes(e) {
            Some(hashes) => {
                let (tokens, total, slots) = (e.tokens, e.total, e.slots);
                let Some(hit) = self.admit_with_prefix(e.seq, hashes, |hit| {
                    slots.max(hit + tokens.min(total - hit))
                }) else {
                    return false;
                };
                hit
            }
            None => {
                if !self.try_grow(e.seq, e.slots, e.write_from, &mut resp.block_copies) {
                    return false;
                }
                0
            }
        };
        resp.granted.push(i);
        resp.hits.push(hit);
        if let Some(p) = self.policy.as_mut() {
            p.on_admitted(e.seq);
        }
        true
    }

    /// The hashes a waiting entry looks up in the prefix cache (`None`: no lookup). A full
    /// hit still recomputes the last token, so the block holding it is never looked up.
    fn usable_hashes<'e>(&self, e: &'e ReserveEntry) -> Option<&'e [u64]> {
        let hashes = e.hashes.as_deref()?;
        if self.policy.is_none() || self.tables.contains_key(&e.seq) {
            return None;
        }
        let usable = (e.total.saturating_sub(1) / self.block_size) as usize;
        Some(&hashes[..hashes.len().min(usable)])
    }

    /// Free blocks a waiting entry uses up when admitted, as [`Self::try_admit`] takes them:
    /// prefix hits on evictable blocks and fresh blocks, the live blocks of a swapped table,
    /// or the growth of a table.
    fn admission_need(&self, e: &ReserveEntry) -> u32 {
        if let Some(src) = self.cpu.as_ref().and_then(|c| c.tables.get(&e.seq)) {
            let nulls = src.iter().filter(|&&c| c == NULL_BLOCK).count() as u32;
            return self.blocks_for(e.slots).max(src.len() as u32) - nulls;
        }
        if let Some(hashes) = self.usable_hashes(e) {
            let (hits, hits_free) = self.lookup(hashes);
            let (tokens, total) = (e.tokens, e.total);
            let hit = hits * self.block_size;
            let want = self
                .blocks_for(e.slots.max(hit + tokens.min(total - hit)))
                .max(hits);
            return want - hits + hits_free;
        }
        let have = self.tables.get(&e.seq).map_or(0, |t| t.len() as u32);
        self.blocks_for(e.slots).saturating_sub(have)
    }

    /// Whether preempting every not-yet-preempted candidate in `victims` would free enough
    /// blocks for `e` to be admitted (its need plus the watermark; blocks shared with
    /// others do not come free), so that priority preemption never evicts in vain.
    fn priority_room(
        &self,
        e: &ReserveEntry,
        watermark: u32,
        victims: &[SeqId],
        preempted: &[SeqId],
    ) -> bool {
        let need = self.admission_need(e) + watermark;
        let mut room = self.num_free();
        for v in victims
            .iter()
            .filter(|v| **v != e.seq && !preempted.contains(v))
        {
            room += self
                .table(*v)
                .iter()
                .filter(|&&b| b != NULL_BLOCK && self.ref_counts[b as usize] == 1)
                .count() as u32;
        }
        room >= need
    }

    /// Serves one step's reservation: grants entries in order, preempting victims when a
    /// running entry does not fit (recompute: the victim's blocks are freed).
    pub fn reserve(&mut self, req: &ReserveRequest) -> ReserveResponse {
        self.tick += 1;

        let evictions_before = self.evictions;
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
                        let have = bm.tables.get(&e.seq).map_or(0, |t| t.len() as u32);
                        if bm.try_grow(e.seq, e.slots, e.write_from, &mut resp.block_copies) {
                            resp.granted.push(i);
                            resp.hits.push(0);
                            if e.lookahead > 0 {
                                // Blocks from here on hold only draft slots.
                                let without = bm.blocks_for(e.slots - e.lookahead.min(e.slots));
                                bm.lookahead.insert(e.seq, have.max(without));
                            }
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
                            bm.preempt(e.seq, resp);
                            preempted.push(e.seq);
                            break;
                        };
                        bm.preempt(v, resp);
                        preempted.push(v);
                        revoke(resp, req, v);
                        if v == e.seq {
                            break;
                        }
                    }
                }
            };
        let watermark = req.watermark_blocks;
        let serve_waiting =
            |bm: &mut Self, resp: &mut ReserveResponse, preempted: &mut Vec<SeqId>| {
                let mut prio = req.priority_victims.iter().copied();
                for (n, (i, e)) in waiting.clone().enumerate() {
                    // Priority preemption (vLLM V0): the head of the queue may evict
                    // running sequences of lower priority, lowest first, if all of them
                    // together would make room (decided once, before evicting anyone).
                    let mut may_preempt = None;
                    loop {
                        if bm.try_admit(i, e, watermark, resp) {
                            break;
                        }
                        let may = *may_preempt.get_or_insert_with(|| {
                            n == 0
                                && !req.priority_victims.is_empty()
                                && bm.priority_room(e, watermark, &req.priority_victims, preempted)
                        });
                        if may {
                            if let Some(v) = prio.find(|&v| v != e.seq && !preempted.contains(&v)) {
                                bm.preempt(v, resp);
                                preempted.push(v);
                                revoke(resp, req, v);
                                continue;
                            }
                        }
                        // FCFS within the queue's order: the first that does not fit stops
                        // admission.
                        return;
                    }
                }
            };

        match req.order {
            ReserveOrder::RunningFirst => {
                serve_running(self, &mut resp, &mut preempted);
                if preempted.is_empty() || !req.priority_victims.is_empty() {
                    serve_waiting(self, &mut resp, &mut preempted);
                }
            }
            ReserveOrder::WaitingFirstExclusive => {
                serve_waiting(self, &mut resp, &mut preempted);
                if resp.granted.is_empty() {
                    serve_running(self, &mut resp, &mut preempted);
                }
            }
        }
        // Entry order (waiting entries may have been served first).
        let mut order: Vec<(usize, u32)> = resp
            .granted
            .iter()
            .copied()
            .zip(resp.hits.iter().copied())
            .collect();
        order.sort_unstable();
        resp.granted = order.iter().map(|&(g, _)| g).collect();
        resp.hits = order.iter().map(|&(_, h)| h).collect();
        resp.evicted = (self.evictions - evictions_before) as u32;
        if req.want_tables {
            resp.tables = resp
                .granted
                .iter()
                .map(|&g| self.table(req.entries[g].seq).to_vec())
                .collect();
        }
        resp.preempted = preempted;
        resp.blocks_used = self.used;
        if let Some(cpu) = self.cpu.as_mut() {
            let released = std::mem::take(&mut cpu.released);
            cpu.free.extend(released);
        }
        self.copy_sources.clear();
        for b in std::mem::take(&mut self.deferred) {
            self.release_block(b);
        }
        if self.extents.is_some() && self.extent_free > 0 {
            resp.external_fragmentation =
                1.0 - f64::from(self.largest_free_run()) / f64::from(self.extent_free);
        }
        if self.policy.is_some() {
            resp.probe_hits = req
                .probe
                .iter()
                .map(|(seq, hashes)| (*seq, self.lookup(hashes).0 * self.block_size))
                .collect();
        }
        resp
    }

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
        let c = self.counts();
        if c.free_uncached + c.free_cached + c.in_use != self.num_blocks() {
            return Err(format!(
                "block counts {c:?} do not sum to the pool size {}",
                self.num_blocks()
            ));
        }
        let mut holders = vec![0u32; self.ref_counts.len()];
        for table in self.tables.values() {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(seq: SeqId, kind: EntryKind, slots: u32) -> ReserveEntry {
        ReserveEntry {
            seq,
            kind,
            slots,
            tokens: slots,
            total: slots,
            hashes: None,
            write_from: 0,
            lookahead: 0,
        }
    }

    #[test]
    fn grows_and_frees_tail_first() {
        let mut bm = BlockManager::new(8, 16);
        let req = ReserveRequest {
            entries: vec![entry(1, EntryKind::Waiting, 33)],
            want_tables: true,
            ..ReserveRequest::default()
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
                ..ReserveRequest::default()
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
            watermark_blocks: 0,
            priority_victims: vec![],
            probe: vec![],
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
            ..ReserveRequest::default()
        });
        let r = bm.reserve(&ReserveRequest {
            entries: vec![
                entry(2, EntryKind::Waiting, 8),
                entry(1, EntryKind::Running, 5),
            ],
            victims: vec![1],
            order: ReserveOrder::WaitingFirstExclusive,
            want_tables: false,
            watermark_blocks: 0,
            priority_victims: vec![],
            probe: vec![],
        });
        assert_eq!(r.granted, vec![1]);
        assert!(r.preempted.is_empty());
    }
}

#[cfg(test)]
mod prefix_tests {
    use super::*;
    use crate::eviction::Lru;
    use crate::prefix::block_hashes;

    fn waiting(seq: SeqId, tokens: &[u32], new: u32) -> ReserveEntry {
        ReserveEntry {
            seq,
            kind: EntryKind::Waiting,
            slots: new,
            tokens: new,
            total: tokens.len() as u32,
            hashes: Some(block_hashes(tokens, 4).into()),
            write_from: 0,
            lookahead: 0,
        }
    }

    fn admit(bm: &mut BlockManager, e: ReserveEntry) -> ReserveResponse {
        bm.reserve(&ReserveRequest {
            entries: vec![e],
            want_tables: true,
            ..ReserveRequest::default()
        })
    }

    /// Computes a whole prompt for `seq` and registers its full blocks.
    fn compute(bm: &mut BlockManager, seq: SeqId, tokens: &[u32]) {
        let hashes = block_hashes(tokens, 4);
        bm.cache_blocks(&[CacheBlocks {
            seq,
            first: 0,
            hashes,
        }]);
    }

    #[test]
    fn hits_share_blocks_and_recompute_the_last_token() {
        let mut bm = BlockManager::with_prefix_caching(16, 4, Box::<Lru>::default());
        let prompt: Vec<u32> = (0..12).collect(); // 3 full blocks
        let r = admit(&mut bm, waiting(1, &prompt, 12));
        assert_eq!(r.hits, vec![0]);
        compute(&mut bm, 1, &prompt);
        bm.check_invariants().unwrap();
        // Same prompt: a full hit would cover 12 tokens, but the last token is recomputed,
        // so only the first 2 blocks (8 tokens) hit.
        let r = admit(&mut bm, waiting(2, &prompt, 12));
        assert_eq!(r.hits, vec![8]);
        assert_eq!(bm.table(2)[..2], bm.table(1)[..2]);
        assert_eq!(bm.counts().in_use, 4); // 3 + 1 new block for the recomputed tail
        bm.check_invariants().unwrap();
    }

    #[test]
    fn freed_blocks_stay_cached_until_evicted() {
        let mut bm = BlockManager::with_prefix_caching(4, 4, Box::<Lru>::default());
        let a: Vec<u32> = (0..9).collect(); // 2 full blocks + 1 token
        admit(&mut bm, waiting(1, &a, 9));
        compute(&mut bm, 1, &a);
        bm.free(1);
        let c = bm.counts();
        assert_eq!((c.free_uncached, c.free_cached, c.in_use), (2, 2, 0));
        // A preempted or new request with the same prefix re-hits what is still cached.
        let r = admit(&mut bm, waiting(2, &a, 9));
        assert_eq!(r.hits, vec![8]);
        bm.free(2);
        // A different 4-block prompt needs every block: the cached ones are evicted.
        let b: Vec<u32> = (100..116).collect();
        let r = admit(&mut bm, waiting(3, &b, 16));
        assert_eq!(r.hits, vec![0]);
        assert_eq!(r.evicted, 2);
        bm.free(3);
        let r = admit(&mut bm, waiting(4, &a, 9));
        assert_eq!(r.hits, vec![0], "evicted blocks must not hit");
        bm.check_invariants().unwrap();
    }
}

#[cfg(test)]
mod contiguous_tests {
    use super::*;

    fn req(entries: Vec<ReserveEntry>) -> ReserveRequest {
        ReserveRequest {
            victims: entries
                .iter()
                .filter(|e| e.kind == EntryKind::Running)
                .map(|e| e.seq)
                .rev()
                .collect(),
            entries,
            order: ReserveOrder::RunningFirst,
            want_tables: true,
            watermark_blocks: 0,
            priority_victims: vec![],
            probe: vec![],
        }
    }

    pub(super) fn entry(seq: SeqId, kind: EntryKind, from: u32, slots: u32) -> ReserveEntry {
        ReserveEntry {
            seq,
            kind,
            slots,
            tokens: slots - from,
            total: slots,
            hashes: None,
            write_from: from,
            lookahead: 0,
        }
    }

    #[test]
    fn runs_are_first_fit_grow_in_place_and_move_when_blocked() {
        let mut bm = BlockManager::new(10, 4).with_contiguous_allocation();
        for (s, tokens) in [(1, 8), (2, 12), (3, 8)] {
            let r = bm.reserve(&req(vec![entry(s, EntryKind::Waiting, 0, tokens)]));
            assert_eq!(r.granted, vec![0]);
        }
        assert_eq!(bm.table(1), [0, 1]);
        assert_eq!(bm.table(2), [2, 3, 4]);
        assert_eq!(bm.table(3), [5, 6]);
        // Seq 2 finishes: a hole of 3 blocks between 1 and 3, and 3 blocks at the end.
        bm.free(2);
        bm.check_invariants().unwrap();
        assert_eq!(bm.largest_free_run(), 3);
        // 6 blocks are free but no run of 4: a 16-token request does not fit.
        let r = bm.reserve(&req(vec![entry(4, EntryKind::Waiting, 0, 16)]));
        assert!(r.granted.is_empty());
        assert!((r.external_fragmentation - 0.5).abs() < 1e-12);
        // Seq 3 grows in place into the blocks right after it.
        let r = bm.reserve(&req(vec![entry(3, EntryKind::Running, 8, 12)]));
        assert_eq!(r.granted, vec![0]);
        assert_eq!(bm.table(3), [5, 6, 7]);
        assert!(r.block_copies.is_empty());
        bm.check_invariants().unwrap();
    }

    #[test]
    fn a_run_that_cannot_grow_in_place_moves() {
        let mut bm = BlockManager::new(8, 4).with_contiguous_allocation();
        for s in [1, 2] {
            bm.reserve(&req(vec![entry(s, EntryKind::Waiting, 0, 8)]));
        }
        assert_eq!((bm.table(1), bm.table(2)), (&[0, 1][..], &[2, 3][..]));
        // Block 2 belongs to seq 2: seq 1 moves to the first run of 3, copying its blocks.
        let r = bm.reserve(&req(vec![entry(1, EntryKind::Running, 8, 12)]));
        assert_eq!(r.granted, vec![0]);
        assert!(r.preempted.is_empty());
        assert_eq!(bm.table(1), [4, 5, 6]);
        assert_eq!(r.block_copies, vec![(0, 4), (1, 5)]);
        bm.check_invariants().unwrap();
        assert_eq!(bm.largest_free_run(), 2);
        bm.free(1);
        bm.free(2);
        assert_eq!(bm.largest_free_run(), 8);
        bm.check_invariants().unwrap();
    }
}

#[cfg(test)]
mod priority_tests {
    use super::*;

    fn waiting(seq: SeqId, slots: u32) -> ReserveEntry {
        super::contiguous_tests::entry(seq, EntryKind::Waiting, 0, slots)
    }

    fn admit(bm: &mut BlockManager, seq: SeqId, blocks: u32) {
        let r = bm.reserve(&ReserveRequest {
            entries: vec![waiting(seq, blocks)],
            ..ReserveRequest::default()
        });
        assert_eq!(r.granted, vec![0]);
    }

    fn head(bm: &mut BlockManager, blocks: u32, watermark: u32) -> ReserveResponse {
        bm.reserve(&ReserveRequest {
            entries: vec![waiting(9, blocks)],
            victims: vec![3, 2, 1],
            watermark_blocks: watermark,
            priority_victims: vec![3, 2],
            ..ReserveRequest::default()
        })
    }

    /// 100 blocks: 60 held by a high-priority request, 5 + 5 by two low-priority ones, 30
    /// free. A head needing 40 with a watermark of 5 cannot fit even if both low-priority
    /// requests go, so neither is preempted; needing 35 it can, and they are.
    #[test]
    fn priority_preemption_is_never_in_vain() {
        let mut bm = BlockManager::new(100, 1);
        for (s, b) in [(1, 60), (2, 5), (3, 5)] {
            admit(&mut bm, s, b);
        }
        let r = head(&mut bm, 40, 5);
        assert!(r.granted.is_empty() && r.preempted.is_empty(), "{r:?}");
        let r = head(&mut bm, 35, 5);
        assert_eq!(r.granted, vec![0]);
        assert_eq!(r.preempted, vec![3, 2]);
        bm.check_invariants().unwrap();
    }
}
