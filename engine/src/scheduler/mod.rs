//! The scheduler: queues, admission and the per-step plan.
//!
//! A [`Scheduler`] owns the live sequences, the FCFS waiting queue and the running set (in
//! admission order). One step goes:
//! 1. [`Scheduler::propose`]: the policy ([`SchedulePolicy`]) picks the sequences and the
//!    tokens of each under `max_num_seqs` and `max_num_batched_tokens`, as one
//!    [`ReserveRequest`] for the block manager;
//! 2. the block manager answers with a [`ReserveResponse`] (granted entries, preempted
//!    victims);
//! 3. [`Scheduler::apply`] turns the answer into a [`StepPlan`] (preempted sequences go
//!    back to the front of the queue, admitted ones join the running set);
//! 4. after the backend ran the step, [`Scheduler::commit`] appends the sampled tokens,
//!    finishes sequences and returns their records and the sequences whose blocks must be
//!    freed.

mod chunked;
mod continuous;
pub mod policy;
mod static_batch;

use std::collections::VecDeque;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::block_manager::{
    CacheBlocks, EntryKind, ReserveEntry, ReserveOrder, ReserveRequest, ReserveResponse,
};
use crate::error::EngineError;
use crate::plan::{SeqWork, StepOutcome, StepPlan, WorkKind};
use crate::record::RequestRecord;
use crate::request::{FinishReason, Nanos, Request, SeqId, SeqStatus, Sequence};

pub use chunked::Chunked;
pub use continuous::Continuous;
pub use policy::{AdmissionPolicy, KvAllocator, PreemptionMode, QueuePolicy, VictimPolicy};
pub use static_batch::StaticBatch;

/// Which scheduling policy runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SchedulerKind {
    /// Request-level batching: a batch of up to `max_num_seqs` is formed, prefilled
    /// together, and decoded until every member finishes; nothing joins mid-batch. KV for
    /// prompt + max_tokens is reserved at admission (as pre-PagedAttention systems do), so
    /// it never preempts.
    Static,
    /// Iteration-level (Orca, vLLM V0): each step is either a batch of whole-prompt
    /// prefills (preferred whenever a waiting request fits) or a decode step of every
    /// running sequence.
    Continuous,
    /// Chunked prefill (vLLM V1, Sarathi): one token budget per step, spent on running
    /// sequences first (decodes and ongoing prefill chunks), then on new prompts, whose
    /// prefill is split into chunks that fit the budget.
    Chunked,
}

impl SchedulerKind {
    /// All kinds, for listings.
    pub const ALL: [SchedulerKind; 3] = [
        SchedulerKind::Static,
        SchedulerKind::Continuous,
        SchedulerKind::Chunked,
    ];

    /// The policy object for this kind.
    pub fn policy(self) -> Box<dyn SchedulePolicy + Send> {
        match self {
            SchedulerKind::Static => Box::new(StaticBatch),
            SchedulerKind::Continuous => Box::new(Continuous),
            SchedulerKind::Chunked => Box::new(Chunked),
        }
    }

    /// Whether a prompt may be split over several steps.
    pub fn chunks_prefill(self) -> bool {
        matches!(self, SchedulerKind::Chunked)
    }

    /// Scenario name of the kind.
    pub fn as_str(self) -> &'static str {
        match self {
            SchedulerKind::Static => "static",
            SchedulerKind::Continuous => "continuous",
            SchedulerKind::Chunked => "chunked",
        }
    }
}

/// Limits the scheduler works under.
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerConfig {
    /// Policy.
    pub kind: SchedulerKind,
    /// Most sequences running at once.
    pub max_num_seqs: u32,
    /// Most tokens in one step.
    pub max_num_batched_tokens: u32,
    /// Longest sequence (prompt + output) accepted.
    pub max_model_len: u32,
    /// Tokens per KV block (prefix-cache hashes cover full blocks).
    pub block_size: u32,
    /// Token slots in the whole KV pool (blocks x block size): a request that cannot fit
    /// alone is rejected on arrival.
    pub pool_tokens: u64,
    /// End-of-sequence token id (real backends); `None` in simulation.
    pub eos_token: Option<u32>,
    /// Ask the block manager for block tables (real backends need them).
    pub want_block_tables: bool,
    /// Keep generated token ids on the sequences (real backends).
    pub keep_tokens: bool,
    /// Look up and register full prompt blocks in the block manager's prefix cache (only
    /// requests that carry token ids can hit).
    pub prefix_caching: bool,
    /// Order of the waiting queue.
    pub queue: QueuePolicy,
    /// Aging period of the SJF queue policies (ns): a waiting request's key halves each
    /// period.
    pub queue_aging_ns: u64,
    /// KV slots reserved at admission.
    pub admission: AdmissionPolicy,
    /// Preemption victim order.
    pub victim: VictimPolicy,
    /// Blocks kept free when admitting new requests (vLLM V0's watermark).
    pub watermark_blocks: u32,
    /// Sliding attention window of the model in tokens (`None`: full attention); the block
    /// manager frees blocks outside it, and the KV held per sequence is bounded by it.
    pub sliding_window: Option<u32>,
    /// Speculative decoding (`None`: off).
    pub speculative: Option<crate::spec::SpecConfig>,
}

impl Default for SchedulerConfig {
    /// vLLM V1's serving defaults (chunked prefill, 256 sequences, a 2,048-token budget,
    /// 16-token blocks, FCFS, optimistic admission, newest victim), a 4,096-token model on
    /// a 64k-token pool, prefix caching off.
    fn default() -> Self {
        SchedulerConfig {
            kind: SchedulerKind::Chunked,
            max_num_seqs: 256,
            max_num_batched_tokens: 2048,
            max_model_len: 4096,
            block_size: 16,
            pool_tokens: 65_536,
            eos_token: None,
            want_block_tables: false,
            keep_tokens: false,
            prefix_caching: false,
            queue: QueuePolicy::Fcfs,
            queue_aging_ns: 10_000_000_000,
            admission: AdmissionPolicy::Optimistic,
            victim: VictimPolicy::Newest,
            watermark_blocks: 0,
            sliding_window: None,
            speculative: None,
        }
    }
}

impl SchedulerConfig {
    /// KV tokens a sequence with `computed` tokens holds: all of them, or under a sliding
    /// window those not yet freed (whole blocks before the window are).
    pub fn held_tokens(&self, computed: u32) -> u32 {
        match self.sliding_window {
            Some(w) => {
                let dropped = (computed + 1).saturating_sub(w) / self.block_size * self.block_size;
                computed - dropped
            }
            None => computed,
        }
    }

    /// Checks that the limits allow progress; the message names the offending key.
    pub fn validate(&self) -> Result<(), EngineError> {
        let bad = |key: &str, msg: String| {
            Err(EngineError::Config {
                key: key.into(),
                msg,
            })
        };
        if self.max_num_seqs == 0 {
            return bad("engine.max_num_seqs", "must be at least 1".into());
        }
        if self.max_num_batched_tokens < self.max_num_seqs {
            return bad(
                "engine.max_num_batched_tokens",
                format!(
                    "({}) must be at least max_num_seqs ({}) so that every running sequence can decode",
                    self.max_num_batched_tokens, self.max_num_seqs
                ),
            );
        }
        if !self.kind.chunks_prefill() && self.max_num_batched_tokens < self.max_model_len {
            return bad(
                "engine.max_num_batched_tokens",
                format!(
                    "({}) is smaller than max_model_len ({}): the {} scheduler prefills whole prompts, so a prompt of max length could never run (use the chunked scheduler or raise the budget)",
                    self.max_num_batched_tokens,
                    self.max_model_len,
                    self.kind.as_str()
                ),
            );
        }
        if self.sliding_window == Some(0) {
            return bad(
                "model.sliding_window",
                "must be at least 1 token (omit it for full attention)".into(),
            );
        }
        if let Some(spec) = &self.speculative {
            if let Err(msg) = spec.validate() {
                return bad("speculative", msg);
            }
        }
        if u64::from(self.max_model_len) > self.pool_tokens {
            return bad(
                "engine.max_model_len",
                format!(
                    "({}) is larger than the KV cache ({} tokens): one sequence of max length would not fit",
                    self.max_model_len, self.pool_tokens
                ),
            );
        }
        Ok(())
    }
}

/// Read-only view of the queues that policies schedule from.
pub struct Queues<'a> {
    /// Live sequences by id.
    pub seqs: &'a FxHashMap<SeqId, Sequence>,
    /// FCFS waiting queue (preempted sequences are put back at the front).
    pub waiting: &'a VecDeque<SeqId>,
    /// Running sequences in admission order (newest last).
    pub running: &'a [SeqId],
}

impl Queues<'_> {
    /// The sequence `id` (present for every id in the queues).
    pub fn seq(&self, id: SeqId) -> &Sequence {
        &self.seqs[&id]
    }

    /// The head of the waiting queue that fits the free seats of `max_num_seqs`, in queue
    /// order, stopping at the first that does not fit (no skipping). A parallel-sampling
    /// request takes its `n` seats at admission.
    pub fn seated(&self, max_num_seqs: u32) -> impl Iterator<Item = SeqId> + '_ {
        let taken: usize = self
            .running
            .iter()
            .map(|&id| self.seq(id).seats() as usize)
            .sum();
        let mut free = (max_num_seqs as usize).saturating_sub(taken);
        self.waiting.iter().copied().map_while(move |id| {
            let need = self.seq(id).seats() as usize;
            (need <= free).then(|| {
                free -= need;
                id
            })
        })
    }
}

/// A proposal: block reservations plus the tokens each entry computes this step.
#[derive(Debug, Clone, Default)]
pub struct Proposal {
    /// Reservation entries in priority order.
    pub entries: Vec<ReserveEntry>,
    /// Tokens each entry computes (same order).
    pub tokens: Vec<u32>,
    /// Order in which the block manager serves the entries.
    pub order: Option<ReserveOrder>,
}

impl Proposal {
    /// Adds an entry computing `tokens` tokens with a block table covering `slots`.
    pub fn push(&mut self, seq: SeqId, kind: EntryKind, tokens: u32, slots: u32) {
        self.entries.push(ReserveEntry {
            seq,
            kind,
            slots,
            tokens,
            total: 0,
            hashes: None,
            write_from: slots.saturating_sub(tokens),
            lookahead: 0,
        });
        self.tokens.push(tokens);
    }
}

/// A scheduling policy: picks this step's sequences and token counts.
pub trait SchedulePolicy {
    /// Policy name.
    fn name(&self) -> &'static str;
    /// Builds the step's proposal from the queues under the limits in `cfg`.
    fn propose(&mut self, q: &Queues<'_>, cfg: &SchedulerConfig) -> Proposal;
}

/// What committing a step produced.
#[derive(Debug, Clone, Default)]
pub struct CommitResult {
    /// Newly full prompt blocks to register in the prefix cache (before freeing).
    pub cache: Vec<CacheBlocks>,
    /// Records of the requests that finished in this step.
    pub finished: Vec<RequestRecord>,
    /// Sequences whose blocks must be freed.
    pub to_free: Vec<SeqId>,
    /// `(parent, child)` forks of parallel sampling: the child shares the parent's blocks
    /// (applied before `to_free`).
    pub forks: Vec<(SeqId, SeqId)>,
    /// Verify steps rolled back to their verified tokens: `(sequence, tokens kept)`
    /// ([`crate::block_manager::BlockManager::rollback`]).
    pub rollback: Vec<(SeqId, u32)>,
}

/// The scheduler core (a plain struct: time is passed in, effects are returned).
pub struct Scheduler {
    cfg: SchedulerConfig,
    policy: Box<dyn SchedulePolicy + Send>,
    seqs: FxHashMap<SeqId, Sequence>,
    waiting: VecDeque<SeqId>,
    running: Vec<SeqId>,
    admissions: u64,
    steps: u64,
    pending_tokens: Vec<u32>,
    itl_gaps: Vec<Nanos>,
    last_admitted_arrival: Option<(Nanos, SeqId)>,
    fcfs_violations: u64,
    new_token_ratio: f64,
    last: StepStats,
    groups: FxHashMap<SeqId, Group>,
    /// The limits the policy plans with: `cfg` but for the token budget, from which the
    /// running decodes' drafts are set aside.
    policy_cfg: SchedulerConfig,
    /// Drafts of each entry of the pending proposal (speculative decoding).
    pending_drafts: Vec<Option<crate::spec::Drafts>>,
    /// Acceptance counters per request class.
    spec_stats: Vec<crate::spec::SpecStats>,
}

/// Scheduler-side facts about the last planned step (for `steps.csv`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepStats {
    /// Tokens the running sequences hold in the KV cache once the step has run.
    pub kv_tokens: u64,
    /// Tokens the step computes again after a recompute preemption dropped them.
    pub recomputed_tokens: u32,
    /// Sequences preempted by swapping (the rest of the step's preemptions recompute).
    pub num_swapped: u32,
    /// External fragmentation of the KV pool after the reservation (contiguous allocator).
    pub external_fragmentation: f64,
}

impl Scheduler {
    /// A scheduler with the policy named in `cfg`.
    pub fn new(cfg: SchedulerConfig) -> Result<Self, EngineError> {
        cfg.validate()?;
        Ok(Scheduler {
            policy: cfg.kind.policy(),
            policy_cfg: cfg.clone(),
            cfg,
            seqs: FxHashMap::default(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            admissions: 0,
            steps: 0,
            pending_tokens: Vec::new(),
            itl_gaps: Vec::new(),
            last_admitted_arrival: None,
            fcfs_violations: 0,
            new_token_ratio: policy::NEW_TOKEN_RATIO.0,
            last: StepStats::default(),
            groups: FxHashMap::default(),
            pending_drafts: Vec::new(),
            spec_stats: Vec::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// Accepts an arriving request, or rejects it at once (the returned record) when it can
    /// never run: prompt + max_tokens longer than `max_model_len` or than the KV pool, or
    /// more parallel sequences (`n`) than `max_num_seqs`.
    pub fn add_request(&mut self, req: Request, now: Nanos) -> Option<RequestRecord> {
        let total = u64::from(req.prompt_len) + u64::from(req.max_tokens);
        if req.prompt_len == 0
            || total > u64::from(self.cfg.max_model_len)
            || total > self.cfg.pool_tokens
            || req.n > self.cfg.max_num_seqs
        {
            return Some(RequestRecord {
                request_id: req.id,
                class: req.class,
                arrival_ns: req.arrival,
                first_scheduled_ns: None,
                first_token_ns: None,
                finish_ns: now,
                prompt_len: req.prompt_len,
                output_len: 0,
                generated_tokens: 0,
                max_tokens: req.max_tokens,
                cached_tokens: 0,
                num_preemptions: 0,
                finish_reason: FinishReason::RejectedTooLong,
            });
        }
        let id = req.id;
        if req.n > 1 {
            self.groups.insert(
                id,
                Group {
                    beam: req.beam_search,
                    members: vec![id],
                    next_child: req.n,
                    ..Group::default()
                },
            );
        }
        let mut seq = Sequence::new(req);
        if self.cfg.prefix_caching && !seq.request.prompt_tokens.is_empty() {
            // Only the prompt's own tokens (a longer list would hash generated positions).
            let n = seq
                .request
                .prompt_tokens
                .len()
                .min(seq.request.prompt_len as usize);
            let hashes =
                crate::prefix::block_hashes(&seq.request.prompt_tokens[..n], self.cfg.block_size);
            // Also for prompts shorter than a block: their generated blocks may be cached.
            seq.block_hashes = Some(hashes.into());
        }
        self.seqs.insert(id, seq);
        self.waiting.push_back(id);
        None
    }

    /// True when some sequence waits or runs.
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// Requests waiting.
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Sequences running.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Live sequences (waiting or running).
    pub fn num_live(&self) -> usize {
        self.seqs.len()
    }

    /// Waiting (and preempted) sequences in queue order.
    pub fn waiting(&self) -> impl Iterator<Item = &Sequence> + '_ {
        self.waiting.iter().filter_map(|id| self.seqs.get(id))
    }

    /// Running sequences in admission order.
    pub fn running(&self) -> &[SeqId] {
        &self.running
    }

    /// A live sequence.
    pub fn sequence(&self, id: SeqId) -> Option<&Sequence> {
        self.seqs.get(&id)
    }

    /// Times a request was admitted before one that arrived earlier without any
    /// preemption in between (DESIGN §3 invariant 8: must stay 0 under FCFS).
    pub fn fcfs_violations(&self) -> u64 {
        self.fcfs_violations
    }

    /// Tokens the running sequences hold in the KV cache after the last planned step.
    pub fn kv_tokens(&self) -> u64 {
        self.last.kv_tokens
    }

    /// Facts about the last planned step.
    pub fn last_step_stats(&self) -> StepStats {
        self.last
    }

    /// Speculative decoding's acceptance counters, by request class (index = class).
    pub fn spec_stats(&self) -> &[crate::spec::SpecStats] {
        &self.spec_stats
    }

    /// Inter-token gaps recorded by the last commits; the caller drains them.
    pub fn take_itl_gaps(&mut self) -> std::vec::Drain<'_, Nanos> {
        self.itl_gaps.drain(..)
    }

    /// Step 1: the policy's reservation request for the block manager.
    pub fn propose(&mut self, now: Nanos) -> ReserveRequest {
        // Queue order: FCFS keeps arrival order (preempted requests in front); the others
        // sort by their key at this instant (aging moves keys with time).
        let (policy, aging) = (self.cfg.queue, self.cfg.queue_aging_ns);
        let lpm_fcfs = policy == QueuePolicy::Lpm && self.waiting.len() > policy::LPM_MAX_QUEUE;
        if policy != QueuePolicy::Fcfs && !lpm_fcfs && self.waiting.len() > 1 {
            let seqs = &self.seqs;
            self.waiting
                .make_contiguous()
                .sort_by_key(|id| policy.key(&seqs[id], now, aging));
        }
        // Chunked prefill with speculation: the running decodes' drafts come before new
        // prompts (vLLM V1 schedules running requests' spec tokens first), so the policy
        // plans within the budget they leave.
        let reserve = if self.cfg.kind == SchedulerKind::Chunked {
            self.draft_reserve()
        } else {
            0
        };
        self.policy_cfg.max_num_batched_tokens = self.cfg.max_num_batched_tokens - reserve;
        let q = Queues {
            seqs: &self.seqs,
            waiting: &self.waiting,
            running: &self.running,
        };
        let mut p = self.policy.propose(&q, &self.policy_cfg);
        // Admission reserve, and prefix-cache lookups for sequences admitted without blocks.
        let static_batch = self.cfg.kind == SchedulerKind::Static;
        for e in &mut p.entries {
            if let Some(s) = self.seqs.get(&e.seq) {
                e.total = s.num_tokens;
                e.write_from = s.num_computed;
                if e.kind == EntryKind::Waiting {
                    if !static_batch {
                        let reserve = self.cfg.admission.slots(
                            s,
                            e.tokens,
                            self.cfg.max_model_len,
                            self.new_token_ratio,
                        );
                        e.slots = e.slots.max(reserve);
                    }
                    if s.num_computed == 0 && !s.swapped {
                        e.hashes = if s.gen_hashes.is_empty() {
                            s.block_hashes.clone()
                        } else {
                            // A recompute may also hit the blocks it generated.
                            let all: Vec<u64> = (0..s.num_block_hashes())
                                .filter_map(|i| s.block_hash(i))
                                .collect();
                            Some(all.into())
                        };
                    }
                }
            }
        }
        self.add_drafts(&mut p);
        self.pending_tokens = p.tokens;
        let mut victims = self.running.clone();
        if self.cfg.victim == VictimPolicy::Newest {
            victims.reverse();
        } else {
            let (seqs, victim) = (&self.seqs, self.cfg.victim);
            victims.sort_by_key(|id| victim.key(&seqs[id]));
        }
        // Priority scheduling preempts for the queue's head: running sequences of strictly
        // lower priority (larger value), the lowest and then the newest first.
        let mut priority_victims = Vec::new();
        if self.cfg.queue == QueuePolicy::Priority {
            let head = p.entries.iter().find(|e| e.kind == EntryKind::Waiting);
            if let Some(head) = head.and_then(|e| self.seqs.get(&e.seq)) {
                let prio = head.request.priority;
                priority_victims = self
                    .running
                    .iter()
                    .copied()
                    .filter(|id| self.seqs[id].request.priority > prio)
                    .collect();
                let seqs = &self.seqs;
                priority_victims.sort_by_key(|id| VictimPolicy::LowestPriority.key(&seqs[id]));
            }
        }
        // Longest-prefix-match asks the block manager for the queue's cached prefixes.
        let probe = if policy == QueuePolicy::Lpm && !lpm_fcfs && self.cfg.prefix_caching {
            self.waiting
                .iter()
                .filter_map(|id| {
                    let s = &self.seqs[id];
                    let h = s.block_hashes.as_ref().filter(|_| s.num_computed == 0)?;
                    Some((*id, h.clone()))
                })
                .collect()
        } else {
            Vec::new()
        };
        ReserveRequest {
            probe,
            priority_victims,
            watermark_blocks: self.cfg.watermark_blocks,
            entries: p.entries,
            victims,
            order: p.order.unwrap_or(ReserveOrder::RunningFirst),
            want_tables: self.cfg.want_block_tables,
        }
    }

    /// Draft tokens the running decodes will ask for this step (at most the budget the
    /// running sequences' own tokens leave).
    fn draft_reserve(&self) -> u32 {
        let Some(spec) = &self.cfg.speculative else {
            return 0;
        };
        let k = spec.dynamic.k(spec.k, self.running.len());
        if k == 0 {
            return 0;
        }
        let total: u32 = self
            .running
            .iter()
            .filter_map(|id| self.seqs.get(id))
            .filter(|s| s.is_decode() && !s.request.beam_search)
            .map(|s| k.min(self.draft_room(s)))
            .sum();
        // Never at the expense of the running sequences' own work (decodes and prefill
        // chunks): only of new prompts.
        let running: u32 = self
            .running
            .iter()
            .filter_map(|id| self.seqs.get(id))
            .map(|s| s.remaining())
            .sum();
        total.min(self.cfg.max_num_batched_tokens.saturating_sub(running))
    }

    /// Drafts worth verifying for `s`: none past the request's last token or the model's
    /// length.
    fn draft_room(&self, s: &Sequence) -> u32 {
        s.request
            .max_tokens
            .saturating_sub(s.output_len + 1)
            .min(self.cfg.max_model_len.saturating_sub(s.num_tokens))
    }

    /// Speculative decoding: turns the proposal's single-token decodes into verify entries
    /// of `1 + k` tokens with `k` lookahead slots. `k` follows the batch (dynamic k), never
    /// drafts past the request's last token or the model's length, and spends only the
    /// token budget the policy left (so prefills already proposed keep theirs); n-gram
    /// drafts come from the sequence's own tokens when the engine keeps them (real
    /// backends), and a sequence without a match decodes normally.
    fn add_drafts(&mut self, p: &mut Proposal) {
        self.pending_drafts.clear();
        self.pending_drafts.resize(p.entries.len(), None);
        let Some(spec) = &self.cfg.speculative else {
            return;
        };
        let k_batch = spec.dynamic.k(spec.k, self.running.len());
        if k_batch == 0 {
            return;
        }
        let used: u32 = p.tokens.iter().sum();
        let mut spare = self.cfg.max_num_batched_tokens.saturating_sub(used);
        for (i, e) in p.entries.iter_mut().enumerate() {
            if e.kind != EntryKind::Running || p.tokens[i] != 1 || spare == 0 {
                continue;
            }
            let Some(s) = self.seqs.get(&e.seq) else {
                continue;
            };
            if !s.is_decode() || s.request.beam_search {
                continue;
            }
            let mut k = k_batch.min(self.draft_room(s)).min(spare);
            let mut tokens = Vec::new();
            if spec.method == crate::spec::Method::Ngram && self.cfg.keep_tokens && k > 0 {
                let context: Vec<u32> = (0..s.num_tokens).map_while(|p| s.token_at(p)).collect();
                tokens = crate::spec::ngram_propose(&context, spec.ngram_min, spec.ngram_max, k);
                k = tokens.len() as u32;
            }
            if k == 0 {
                continue;
            }
            spare -= k;
            e.tokens += k;
            e.slots = e.slots.max(s.num_tokens + k);
            e.lookahead = k;
            p.tokens[i] += k;
            self.pending_drafts[i] = Some(crate::spec::Drafts {
                k,
                tokens,
                acceptance: spec.acceptance_of(usize::from(s.request.class)).clone(),
            });
        }
    }

    /// Step 2: turns the block manager's answer into the step plan.
    pub fn apply(
        &mut self,
        req: &ReserveRequest,
        mut resp: ReserveResponse,
        now: Nanos,
    ) -> StepPlan {
        // SGLang's estimate decays each step and resets after a preemption.
        let (init, min, decay) = policy::NEW_TOKEN_RATIO;
        self.new_token_ratio = if resp.preempted.is_empty() {
            (self.new_token_ratio - decay).max(min)
        } else {
            init
        };
        // Preempted sequences (recompute) return to the front of the queue; victims come
        // newest first, so prepending each leaves the oldest at the head.
        if !resp.preempted.is_empty() {
            for &v in &resp.preempted {
                if let Some(s) = self.seqs.get_mut(&v) {
                    s.status = SeqStatus::Preempted;
                    // Swapped blocks come back as new GPU blocks: their hashes are offered
                    // to the prefix cache again after the swap-in.
                    s.hashed_blocks = 0;
                    s.num_preemptions += 1;
                    if resp.swapped.contains(&v) {
                        s.swapped = true;
                    } else {
                        s.recompute_upto = s.recompute_upto.max(s.num_computed);
                        s.num_computed = 0;
                        s.shared_tokens = 0;
                    }
                }
                self.waiting.push_front(v);
            }
            let pre = &resp.preempted;
            self.running.retain(|id| !pre.contains(id));
            // The FCFS check restarts after a preemption: re-admissions are legitimate.
            self.last_admitted_arrival = None;
        }
        for &(id, hit) in &resp.probe_hits {
            if let Some(s) = self.seqs.get_mut(&id) {
                s.probed_prefix = hit;
            }
        }
        let mut tables = std::mem::take(&mut resp.tables).into_iter();
        let mut work = Vec::with_capacity(resp.granted.len());
        let mut recomputed = 0;
        for (k, &g) in resp.granted.iter().enumerate() {
            let entry = &req.entries[g];
            let mut tokens = self.pending_tokens[g];
            let hit = resp.hits.get(k).copied().unwrap_or(0);
            if entry.kind == EntryKind::Waiting {
                // Granted waiting entries are a prefix of the queue (no skipping), behind
                // only the sequences preempted in this very step (priority preemption).
                if let Some(pos) = self.waiting.iter().position(|&id| id == entry.seq) {
                    self.waiting.remove(pos);
                }
                self.running.push(entry.seq);
            }
            let Some(s) = self.seqs.get_mut(&entry.seq) else {
                continue;
            };
            if hit > 0 {
                // Prefix-cache hit: those tokens are already in the KV cache.
                s.num_computed = hit;
                s.hashed_blocks = hit / self.cfg.block_size;
                tokens = tokens.min(s.num_tokens - hit);
                if s.first_scheduled.is_none() {
                    s.cached_tokens = hit;
                }
            }
            if entry.kind == EntryKind::Waiting {
                s.status = SeqStatus::Running;
                s.swapped = false;
                s.admitted_seq = self.admissions;
                self.admissions += 1;
                if s.first_scheduled.is_none() {
                    s.first_scheduled = Some(now);
                    let key = (s.request.arrival, s.request.id);
                    if self.cfg.queue == QueuePolicy::Fcfs {
                        if let Some(last) = self.last_admitted_arrival {
                            if key < last {
                                self.fcfs_violations += 1;
                            }
                        }
                        self.last_admitted_arrival = Some(key);
                    }
                }
            }
            if tokens == 0 {
                // Admitted (blocks reserved) but not computing in this step.
                tables.next();
                continue;
            }
            let drafts = self.pending_drafts.get(g).cloned().flatten();
            let kind = if drafts.is_some() {
                WorkKind::Verify
            } else if s.is_decode() {
                WorkKind::Decode
            } else {
                WorkKind::Prefill
            };
            let mut token_ids: Vec<u32> = if self.cfg.keep_tokens {
                (s.num_computed..s.num_computed + tokens)
                    .map_while(|p| s.token_at(p))
                    .collect()
            } else {
                Vec::new()
            };
            if let Some(d) = drafts.as_ref().filter(|_| self.cfg.keep_tokens) {
                // The last token, then the engine's drafts (none: the backend drafts).
                token_ids.extend_from_slice(&d.tokens);
            }
            let start = s.num_computed;
            recomputed += s.recompute_upto.min(start + tokens).saturating_sub(start);
            work.push(SeqWork {
                seq: entry.seq,
                kind,
                start: s.num_computed,
                len: tokens,
                sample: drafts.is_some() || s.num_computed + tokens == s.num_tokens,
                // The prompt's last position samples all `n` first tokens (the fork).
                num_samples: if s.output_len == 0 {
                    s.request.n.max(1)
                } else {
                    1
                },
                block_table: tables.next().unwrap_or_default(),
                token_ids,
                sampling: s.request.sampling,
                drafts,
            });
        }
        // Tokens the running sequences hold once this step has run (fragmentation metric).
        let seqs = &self.seqs;
        let kv_tokens = self
            .running
            .iter()
            .filter_map(|id| seqs.get(id))
            .map(|s| {
                // Full blocks a forked sequence shares with its parent count once.
                u64::from(
                    self.cfg
                        .held_tokens(s.num_computed)
                        .saturating_sub(s.shared_tokens),
                )
            })
            .sum::<u64>()
            + work.iter().map(|w| u64::from(w.len)).sum::<u64>();
        self.last = StepStats {
            kv_tokens,
            recomputed_tokens: recomputed,
            num_swapped: resp.swapped.len() as u32,
            external_fragmentation: resp.external_fragmentation,
        };
        let plan = StepPlan {
            step: self.steps,
            start: now,
            work,
            preempted: resp.preempted,
            swap_in: resp.swap_in,
            swap_out: resp.swap_out,
            block_copies: resp.block_copies,
        };
        self.steps += 1;
        plan
    }

    /// Step 3: commits the backend's outcome at time `now` (the step's end).
    pub fn commit(
        &mut self,
        plan: &StepPlan,
        outcome: &StepOutcome,
        now: Nanos,
    ) -> Result<CommitResult, EngineError> {
        if outcome.accepted.len() != plan.num_verify() {
            return Err(EngineError::Backend(format!(
                "step {}: backend returned {} acceptance counts for {} verify steps",
                plan.step,
                outcome.accepted.len(),
                plan.num_verify()
            )));
        }
        let expected = StepOutcome::expected_samples(plan, &outcome.accepted);
        if outcome.sampled.len() != expected {
            return Err(EngineError::Backend(format!(
                "step {}: backend returned {} sampled tokens where the plan and its acceptances make {}",
                plan.step,
                outcome.sampled.len(),
                expected
            )));
        }
        let mut result = CommitResult::default();
        let mut sampled = outcome.sampled.iter();
        let mut accepted = outcome.accepted.iter();
        let mut sampled_groups: Vec<SeqId> = Vec::new();
        let bs = self.cfg.block_size;
        for w in &plan.work {
            let Some(s) = self.seqs.get_mut(&w.seq) else {
                return Err(EngineError::Backend(format!(
                    "step {}: sequence {} is not live",
                    plan.step, w.seq
                )));
            };
            if w.kind == WorkKind::Verify {
                // The last token and the accepted drafts are verified; the model's own
                // token follows them. Rejected slots are rolled back below.
                let k = w.len.saturating_sub(1);
                let a = accepted.next().copied().unwrap_or(0);
                if a > k {
                    return Err(EngineError::Backend(format!(
                        "step {}: sequence {} accepted {a} of {k} drafts",
                        plan.step, w.seq
                    )));
                }
                let tokens: Vec<u32> = (0..=a)
                    .map(|_| sampled.next().copied().unwrap_or(crate::backend::SIM_TOKEN))
                    .collect();
                let computed = s.num_computed + 1 + a;
                let (keep, eos) = (self.cfg.keep_tokens, self.cfg.eos_token);
                let (mut reason, mut emitted) = (None, 0u32);
                for (j, &t) in tokens.iter().enumerate() {
                    // One inter-token gap per step: the tokens arrive together.
                    reason = append_token(s, t, now, keep, eos, &mut self.itl_gaps, j == 0);
                    emitted += 1;
                    if reason.is_some() {
                        break;
                    }
                }
                // (A request that ended inside the accepted drafts has fewer tokens.)
                s.num_computed = computed.min(s.num_tokens);
                register_full_blocks(s, bs, w.seq, &mut result.cache);
                let class = usize::from(s.request.class);
                if self.spec_stats.len() <= class {
                    self.spec_stats.resize(class + 1, Default::default());
                }
                self.spec_stats[class].record(k, a, emitted);
                if let Some(g) = self.groups.get_mut(&s.request.id) {
                    g.generated += emitted;
                }
                match reason {
                    None => result.rollback.push((w.seq, s.num_computed)),
                    Some(reason) => {
                        s.status = SeqStatus::Finished;
                        result.to_free.push(w.seq);
                        if let Some(rec) = self.finish(w.seq, reason, now) {
                            result.finished.push(rec);
                        }
                    }
                }
                continue;
            }
            s.num_computed += w.len;
            // Newly full blocks join the prefix cache (before any free below): the prompt's,
            // and those holding generated tokens when their ids are known.
            register_full_blocks(s, bs, w.seq, &mut result.cache);
            if !w.sample {
                continue;
            }
            let k = w.num_samples.max(1) as usize;
            let tokens: Vec<u32> = (0..k)
                .map(|_| sampled.next().copied().unwrap_or(crate::backend::SIM_TOKEN))
                .collect();
            // Parallel sampling: the prompt's first `n` tokens fork the sequence; the
            // children share its blocks (forked in the block manager with this commit).
            let mut children = Vec::new();
            if k > 1 {
                for (j, &t) in tokens.iter().enumerate().skip(1) {
                    let mut c = s.clone();
                    c.request.n = 1;
                    // Preemptions before the fork were the parent's (counted once).
                    c.num_preemptions = 0;
                    c.shared_tokens = s.num_computed / self.cfg.block_size * self.cfg.block_size;
                    let id = child_id(s.request.id, j as u32);
                    c.admitted_seq = self.admissions;
                    self.admissions += 1;
                    children.push((id, c, t));
                }
                if let Some(g) = self.groups.get_mut(&s.request.id) {
                    g.members.extend(children.iter().map(|(id, _, _)| *id));
                }
            }
            if let Some(g) = self.groups.get_mut(&s.request.id) {
                g.generated += k as u32;
                if g.beam {
                    sampled_groups.push(s.request.id);
                }
            }
            let keep = self.cfg.keep_tokens;
            let eos = self.cfg.eos_token;
            let mut outcomes = Vec::with_capacity(k);
            let reason = append_token(s, tokens[0], now, keep, eos, &mut self.itl_gaps, true);
            outcomes.push((w.seq, reason));
            for (id, mut c, t) in children {
                let reason = append_token(&mut c, t, now, keep, eos, &mut self.itl_gaps, true);
                if reason.is_none() {
                    result.forks.push((w.seq, id));
                    self.running.push(id);
                }
                self.seqs.insert(id, c);
                outcomes.push((id, reason));
            }
            for (id, reason) in outcomes {
                let Some(reason) = reason else { continue };
                if let Some(s) = self.seqs.get_mut(&id) {
                    s.status = SeqStatus::Finished;
                }
                // A child that ends at its first token was never forked: nothing to free.
                if id == w.seq || result.forks.iter().any(|&(_, c)| c == id) {
                    result.to_free.push(id);
                }
                if let Some(rec) = self.finish(id, reason, now) {
                    result.finished.push(rec);
                }
            }
        }
        sampled_groups.dedup();
        for rid in sampled_groups {
            self.reselect_beams(rid, plan, &mut result);
        }
        if !result.to_free.is_empty() {
            let seqs = &self.seqs;
            self.running.retain(|id| {
                seqs.get(id)
                    .is_some_and(|s| s.status != SeqStatus::Finished)
            });
            for id in &result.to_free {
                self.seqs.remove(id);
            }
        }
        // Children that ended at their first token hold no blocks but are done too.
        self.seqs.retain(|_, s| s.status != SeqStatus::Finished);
        Ok(result)
    }

    /// Beam search: once every beam of request `rid` has a new token (and none finished),
    /// the `n` beams of the next step are chosen among their continuations. A synthetic
    /// choice stands in for the top-`n` by log-probability: new beam `j` continues old beam
    /// `floor(n u^2)` (`u` uniform, seeded by request, step and `j`), so the best beams
    /// are often continued twice or more and the worst die. A beam continued `k` times
    /// forks `k - 1` children (sharing its blocks copy-on-write); a beam not continued is
    /// freed.
    fn reselect_beams(&mut self, rid: SeqId, plan: &StepPlan, result: &mut CommitResult) {
        let Some(g) = self.groups.get(&rid) else {
            return;
        };
        let members = g.members.clone();
        let w = members.len();
        let in_step = |m: &SeqId| plan.work.iter().any(|x| x.seq == *m && x.sample);
        let running = |m: &SeqId| {
            self.seqs
                .get(m)
                .is_some_and(|s| s.status == SeqStatus::Running)
        };
        if w < 2 || !members.iter().all(|m| in_step(m) && running(m)) {
            return;
        }
        // Only beams in step with each other (a preempted one may lag behind).
        let step = self.seqs[&members[0]].output_len;
        if members.iter().any(|m| self.seqs[m].output_len != step) {
            return;
        }
        let mut times = vec![0u32; w];
        for j in 0..w {
            let u = beam_draw(rid, step, j as u32);
            times[((w as f64 * u * u) as usize).min(w - 1)] += 1;
        }
        let mut next_members = Vec::with_capacity(w);
        let mut killed_preemptions = 0;
        for (i, &m) in members.iter().enumerate() {
            if times[i] == 0 {
                if let Some(s) = self.seqs.get_mut(&m) {
                    s.status = SeqStatus::Finished;
                    killed_preemptions += s.num_preemptions;
                }
                result.to_free.push(m);
                continue;
            }
            next_members.push(m);
            for _ in 1..times[i] {
                let Some(parent) = self.seqs.get(&m) else {
                    break;
                };
                let mut c = parent.clone();
                c.num_preemptions = 0;
                c.shared_tokens = parent.num_computed / self.cfg.block_size * self.cfg.block_size;
                c.admitted_seq = self.admissions;
                self.admissions += 1;
                let Some(g) = self.groups.get_mut(&rid) else {
                    break;
                };
                let id = child_id(rid, g.next_child);
                g.next_child += 1;
                result.forks.push((m, id));
                self.running.push(id);
                self.seqs.insert(id, c);
                next_members.push(id);
            }
        }
        if let Some(g) = self.groups.get_mut(&rid) {
            g.members = next_members;
            g.preemptions += killed_preemptions;
        }
    }

    /// Accounts a finished sequence; returns its request's record once every sequence of
    /// the request has finished.
    fn finish(&mut self, id: SeqId, reason: FinishReason, now: Nanos) -> Option<RequestRecord> {
        let s = self.seqs.get(&id)?;
        let mut rec = RequestRecord {
            request_id: s.request.id,
            class: s.request.class,
            arrival_ns: s.request.arrival,
            first_scheduled_ns: s.first_scheduled,
            first_token_ns: s.first_token,
            finish_ns: now,
            prompt_len: s.request.prompt_len,
            output_len: s.output_len,
            generated_tokens: s.output_len,
            max_tokens: s.request.max_tokens,
            cached_tokens: s.cached_tokens,
            num_preemptions: s.num_preemptions,
            finish_reason: reason,
        };
        let Some(g) = self.groups.get_mut(&rec.request_id) else {
            return Some(rec);
        };
        g.members.retain(|&m| m != id);
        g.output_len = g.output_len.max(s.output_len);
        g.preemptions += s.num_preemptions;
        if id == rec.request_id {
            g.first = Some(rec.clone());
        }
        if !g.members.is_empty() {
            return None;
        }
        let g = self.groups.remove(&rec.request_id)?;
        // The request's record: the first sequence's times and cache hit, the longest
        // output (for TPOT) and every sequence's tokens.
        if let Some(first) = g.first {
            rec.first_scheduled_ns = first.first_scheduled_ns;
            rec.cached_tokens = first.cached_tokens;
        }
        rec.output_len = g.output_len;
        rec.generated_tokens = g.generated;
        rec.num_preemptions = g.preemptions;
        Some(rec)
    }
}

/// Sequence id of child `k` (1..n) of a parallel-sampling request: the request id with `k`
/// in the bits above 40 (request ids stay below 2^40).
pub fn child_id(request: SeqId, k: u32) -> SeqId {
    request | (u64::from(k) << 40)
}

/// Registers `s`'s newly full blocks for the prefix cache: the prompt's, and those
/// holding generated tokens when their ids are known (only computed, verified tokens).
fn register_full_blocks(s: &mut Sequence, bs: u32, seq: SeqId, cache: &mut Vec<CacheBlocks>) {
    if s.block_hashes.is_none() {
        return;
    }
    let full = (s.num_computed / bs) as usize;
    while s.num_block_hashes() < full {
        let i = s.num_block_hashes();
        let ids: Option<Vec<u32>> = (i as u32 * bs..(i as u32 + 1) * bs)
            .map(|p| s.token_at(p))
            .collect();
        let Some(ids) = ids else { break };
        let parent = if i == 0 { Some(0) } else { s.block_hash(i - 1) };
        let Some(parent) = parent else { break };
        s.gen_hashes.push(crate::prefix::chain_hash(parent, &ids));
    }
    let full = full.min(s.num_block_hashes()) as u32;
    if full > s.hashed_blocks {
        cache.push(CacheBlocks {
            seq,
            first: s.hashed_blocks,
            hashes: (s.hashed_blocks as usize..full as usize)
                .filter_map(|i| s.block_hash(i))
                .collect(),
        });
        s.hashed_blocks = full;
    }
}

/// Appends a sampled token to `s` (recording its inter-token gap when `gap`: a verify
/// step's tokens arrive together and count one gap); returns why it finished, if it did.
fn append_token(
    s: &mut Sequence,
    mut token: u32,
    now: Nanos,
    keep_tokens: bool,
    eos: Option<u32>,
    itl_gaps: &mut Vec<Nanos>,
    gap: bool,
) -> Option<FinishReason> {
    let scripted = !s.request.scripted_output.is_empty();
    if scripted && !keep_tokens {
        // Simulation: the workload knows the answer (multi-turn history).
        if let Some(&t) = s.request.scripted_output.get(s.output_len as usize) {
            token = t;
        }
    }
    s.output_len += 1;
    s.num_tokens += 1;
    if keep_tokens || scripted {
        s.output_tokens.push(token);
    }
    match s.last_token {
        Some(last) if gap => itl_gaps.push(now - last),
        Some(_) => {}
        None => s.first_token = Some(now),
    }
    s.last_token = Some(now);
    if s.output_len >= s.request.max_tokens {
        Some(FinishReason::Length)
    } else if !s.request.ignore_eos && Some(token) == eos {
        Some(FinishReason::Stop)
    } else {
        None
    }
}

/// The sequences of a parallel-sampling or beam-search request, until all have finished.
#[derive(Debug, Clone, Default)]
struct Group {
    /// Tokens sampled for the request, over all its sequences.
    generated: u32,
    output_len: u32,
    preemptions: u32,
    first: Option<RequestRecord>,
    /// Beam search: beams are re-chosen after every token.
    beam: bool,
    /// Live sequences, in beam order (best first).
    members: Vec<SeqId>,
    /// Next child index for sequence ids.
    next_child: u32,
}

/// A uniform draw in [0, 1) from `(request, step, j)`: the synthetic beam choices.
fn beam_draw(request: SeqId, step: u32, j: u32) -> f64 {
    let h = crate::prefix::chain_hash(request, &[step, j]);
    (h >> 11) as f64 / (1u64 << 53) as f64
}
