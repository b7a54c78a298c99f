//! The paged KV-cache block manager (vLLM's design).
//!
//! The pool holds `num_blocks` fixed-size blocks of `block_size` token slots. Each sequence
//! owns a block table (logical block i -> physical block id). Blocks carry a reference
//! count so that copy-on-write forks and prefix sharing can share a block; a block
//! with ref count 0 sits in the free queue. Freed blocks are appended to the tail of the
//! free queue and allocation takes from the head, so the queue is already in the order an
//! LRU prefix cache evicts (vLLM V1's `FreeKVCacheBlockQueue`).
//!
//! The scheduler talks to the block manager once per step: a [`ReserveRequest`] lists the
//! sequences it wants to run with the slots each needs; [`BlockManager::reserve`] grants
//! them in order, preempting victims when blocks run out, and answers with a
//! [`ReserveResponse`].
//!
//! This file holds the types and the pool's state; the operations are grouped by concern:
//! `reserve.rs` (the step's reservation and admission), `release.rs` (freeing, forks,
//! rollbacks, the sliding window), `prefix.rs` (the prefix cache), `swap.rs` (preemption
//! and the CPU swap pool), `contiguous.rs` (the pre-PagedAttention baseline allocator),
//! `hybrid.rs` (the side tables of a hybrid model's sliding and linear-attention layers)
//! and `invariants.rs` (the checks the property tests run).

mod contiguous;
mod hybrid;
mod invariants;
pub mod offload;
mod prefix;
mod release;
mod reserve;
mod swap;

use std::collections::VecDeque;
use std::sync::Arc;

use rustc_hash::FxHashMap;

pub use hybrid::{max_side_pages, SideGroup};

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
    /// A waiting prompt that must be prefilled whole in this step (the chunked scheduler
    /// without chunked prefill): refused, ending the step's admissions, unless its tokens
    /// not found in the prefix cache fit `tokens`.
    pub whole: bool,
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
    /// A running entry that does not fit once the victims are spent sits the step out,
    /// keeping its blocks, instead of being preempted: steps in flight hold sequences that
    /// are no victims now and may be after their commit (pipelined micro-batches; else
    /// the oldest sequence could preempt itself over and over while a newer one runs).
    pub defer_stuck: bool,
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
    /// Blocks loaded from the offload tiers into fresh GPU blocks (prefix hits there).
    pub offload_loads: u32,
    /// Of those, the blocks read from the disk tier first.
    pub disk_loads: u32,
    /// Cached prefix tokens of each probed sequence, after the reservation.
    pub probe_hits: Vec<(SeqId, u32)>,
    /// Copy-on-write copies `(src, dst)`: a shared block a sequence writes into this step.
    pub block_copies: Vec<(u32, u32)>,
    /// External fragmentation after the reservation: `1 - longest free run / free blocks`
    /// (0 for the paged allocator, where any free block will do).
    pub external_fragmentation: f64,
    /// A running entry sat the step out for want of victims (`defer_stuck`); no waiting
    /// entry was admitted behind it.
    pub deferred: bool,
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
    /// A CPU tier under the prefix cache (`None`: none).
    offload: Option<Box<offload::OffloadTier>>,
    /// Blocks loaded from the tiers in the reservation under way, and of those from disk.
    offload_loads: u32,
    disk_loads: u32,
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
    /// Groups of layers beside the main table (a hybrid model's sliding and linear layers).
    side: Vec<SideGroup>,
    /// Per sequence holding blocks, one table per side group.
    side_tables: FxHashMap<SeqId, Vec<Vec<u32>>>,
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
            offload: None,
            offload_loads: 0,
            disk_loads: 0,
            copy_sources: Vec::new(),
            deferred: Vec::new(),
            window: None,
            extents: None,
            extent_free: 0,
            lookahead: FxHashMap::default(),
            side: Vec::new(),
            side_tables: FxHashMap::default(),
        }
    }

    /// A CPU tier of `blocks` blocks under the prefix cache (needs prefix caching):
    /// blocks written to it as they fill or as the GPU evicts them (`store`), dropped by
    /// `policy` when it is full; a prompt's leading blocks past the GPU's hits that the
    /// tier holds are loaded back (fresh GPU blocks, listed as the step's
    /// `offload_loads`) instead of recomputed.
    pub fn with_offload(
        mut self,
        blocks: u32,
        store: offload::OffloadStore,
        policy: offload::OffloadPolicy,
    ) -> Self {
        if self.policy.is_some() && blocks > 0 {
            self.offload = Some(Box::new(offload::OffloadTier::new(blocks, store, policy)));
        }
        self
    }

    /// A disk tier of `blocks` blocks under the CPU tier (needs one): it keeps the blocks
    /// the CPU tier drops, by `policy`; a prompt's leading blocks found there are read from
    /// disk and loaded like the CPU tier's (the step's `disk_loads`), and promoted to the
    /// CPU tier.
    pub fn with_disk_tier(mut self, blocks: u32, policy: offload::OffloadPolicy) -> Self {
        if let Some(t) = self.offload.take() {
            self.offload = Some(Box::new(t.with_lower(blocks, policy)));
        }
        self
    }

    /// The offload tiers' counters (`None`: no tier).
    pub fn offload_stats(&self) -> Option<offload::OffloadStats> {
        self.offload.as_ref().map(|t| t.stats())
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
            whole: false,
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
            defer_stuck: false,
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
            defer_stuck: false,
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
            whole: false,
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

    /// A prefix evicted from the GPU cache comes back from the CPU tier: its blocks are
    /// hits (fresh GPU blocks, counted as loads), not recomputed; without the tier it is
    /// recomputed.
    #[test]
    fn an_evicted_prefix_is_loaded_from_the_offload_tier() {
        use offload::{OffloadPolicy, OffloadStore};
        for store in [OffloadStore::WriteThrough, OffloadStore::OnEvict] {
            for (tier, expect_hit) in [(0, 0), (64, 8)] {
                let mut bm = BlockManager::with_prefix_caching(4, 4, Box::<Lru>::default())
                    .with_offload(tier, store, OffloadPolicy::Lru);
                let a: Vec<u32> = (0..12).collect();
                admit(&mut bm, waiting(1, &a, 12));
                compute(&mut bm, 1, &a);
                bm.release(&[], &[], &[], &[1]);
                // Another prompt takes every block: a's cached blocks are evicted.
                let b: Vec<u32> = (100..116).collect();
                admit(&mut bm, waiting(2, &b, 16));
                compute(&mut bm, 2, &b);
                bm.release(&[], &[], &[], &[2]);
                bm.check_invariants().unwrap();
                let r = admit(&mut bm, waiting(3, &a, 12));
                assert_eq!(r.hits, vec![expect_hit], "{store:?}, tier {tier}");
                assert_eq!(r.offload_loads, expect_hit / 4);
                assert_eq!(bm.table(3).len(), 3);
                bm.check_invariants().unwrap();
                let st = bm.offload_stats();
                assert_eq!(st.is_some(), tier > 0);
                if let Some(st) = st {
                    assert_eq!(st.loads, 2);
                    assert!(st.blocks <= st.capacity);
                }
                // Loaded blocks rejoined the GPU cache: the next request hits them there.
                compute(&mut bm, 3, &a);
                bm.release(&[], &[], &[], &[3]);
                let r = admit(&mut bm, waiting(4, &a, 12));
                assert_eq!(
                    (r.hits[0], r.offload_loads),
                    (8, 0),
                    "{store:?}, tier {tier}"
                );
            }
        }
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
            defer_stuck: false,
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
            whole: false,
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
