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

mod apply;
mod backlog;
mod chunked;
mod commit;
mod continuous;
pub mod policy;
mod propose;
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
    /// prefill is split into chunks that fit the budget (or, with
    /// [`SchedulerConfig::chunked_prefill`] off, mixed in whole).
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
            SchedulerKind::Chunked => Box::new(Chunked::default()),
        }
    }

    /// Whether the kind can split a prompt over several steps (the chunked scheduler does
    /// unless [`SchedulerConfig::chunked_prefill`] is off).
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
    /// Static batching as Hugging Face `generate` runs a batch: prompts padded to the
    /// batch's longest, finished members decoding pad tokens until the last one ends
    /// ([`crate::plan::Padding`]). Only with [`SchedulerKind::Static`].
    pub static_padding: bool,
    /// Steps that may be in flight at once (vLLM's `max_concurrent_batches`: the pipeline
    /// stages under pipeline parallelism, each running its own micro-batch). A step is
    /// planned from the sequences of requests that no step in flight holds; 1 plans each
    /// step after the last one's commit. The driver decides how many it keeps in flight.
    pub max_concurrent_batches: u32,
    /// TensorRT-LLM's batch waiting (`batch_wait_timeout_iters`,
    /// `batch_wait_max_tokens_ratio`): while sequences decode, new prompts are held back
    /// until enough have gathered or enough steps have passed (`None`: off). Only with
    /// [`SchedulerKind::Chunked`].
    pub batch_wait: Option<BatchWait>,
    /// Arrivals held back until the scheduler polls for them (`None`: each step takes in
    /// every arrival so far).
    pub arrival_poll: Option<ArrivalPoll>,
    /// Split a new prompt into chunks that fit the step's budget (vLLM's and TensorRT-LLM's
    /// `enable_chunked_prefill`). `false`: a waiting prompt joins a step only whole, and
    /// the first that does not fit what is left of the budget ends the step's admissions
    /// (FCFS, as both engines do; a long prompt at the head holds back the shorter ones
    /// behind it until the decodes beside it leave room). With prefix caching only the
    /// tokens the cache does not hold must fit, as vLLM counts them (the block manager
    /// decides, [`crate::block_manager::ReserveEntry::whole`]). Only with
    /// [`SchedulerKind::Chunked`].
    pub chunked_prefill: bool,
    /// SGLang's `--max-prefill-tokens` as its mixed chunks (`--enable-mixed-chunk`) spend
    /// it (`None`: off). Only with [`SchedulerKind::Chunked`]. The step's first prefill (a
    /// running prompt's next chunk or, failing one, the first new prompt) takes what
    /// `max_num_batched_tokens` leaves beside the decodes, as SGLang's chunk budget does;
    /// a later new prompt joins only if its remaining tokens are fewer than this many less
    /// the step's tokens so far (SGLang's `PrefillAdder`: `rem_input_tokens` starts at
    /// `max_prefill_tokens` less one per running decode, and a request that does not fit
    /// it ends the step's admissions unless nothing prefills yet). Cached prefix tokens
    /// are counted as not cached.
    pub max_prefill_tokens: Option<u32>,
}

/// Arrivals reach the waiting queue only when the scheduler polls for them. It counts the
/// steps it runs and polls when the count reaches `interval` (then restarts it), and at once
/// when it has nothing to run. Two engines work this way:
/// - SGLang's `--scheduler-recv-interval`: its loop reads the tokenizer's socket after a
///   step that prefilled, but only every `interval` decode steps otherwise
///   (`after_prefill`);
/// - TensorRT-LLM's attention-DP balancing (`attention_dp_config.enable_balance`,
///   `timeout_iters`): new prompts wait until every rank of the group has one, or
///   `timeout_iters` steps have passed, or a rank has nothing to decode. Each simulated
///   rank decides alone (a single-engine run simulates one rank; a fleet's ranks keep a
///   count each), so the timeout (every step counts) and the release when this rank has
///   no sequence decoding are modelled, not the group's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArrivalPoll {
    /// Steps between polls (at least 1).
    pub interval: u32,
    /// SGLang's loop: a step that prefilled is followed by a poll, and the scheduler polls
    /// when it has nothing to run. Otherwise (TensorRT-LLM's balancing) a prefill counts as
    /// one step, and the scheduler polls when none of its sequences is decoding.
    pub after_prefill: bool,
}

/// TensorRT-LLM's batch waiting (its PyTorch executor's `_waiting_requests`): in a step
/// that would start new prompts while others decode, the new prompts wait unless the
/// step's tokens (the new prompts' and one per decode) reach `max_tokens_ratio x
/// max_num_batched_tokens`, or they have already waited `timeout_iters` steps; then all
/// of them start and the count restarts. With nothing decoding they start at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchWait {
    /// Steps new prompts may be held back (`batch_wait_timeout_iters`).
    pub timeout_iters: u32,
    /// Share of the token budget that starts them at once (`batch_wait_max_tokens_ratio`).
    pub max_tokens_ratio: f64,
}

impl BatchWait {
    /// Whether a step with `tokens` scheduled, of a `budget`, starts its new prompts after
    /// `waited` steps held back.
    pub fn releases(&self, waited: u32, tokens: u32, budget: u32) -> bool {
        waited >= self.timeout_iters
            || f64::from(tokens) >= self.max_tokens_ratio * f64::from(budget)
    }
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
            static_padding: false,
            max_concurrent_batches: 1,
            batch_wait: None,
            arrival_poll: None,
            chunked_prefill: true,
            max_prefill_tokens: None,
        }
    }
}

impl SchedulerConfig {
    /// Whether a prompt may be split over several steps: the chunked scheduler with
    /// chunked prefill on.
    pub fn chunks_prefill(&self) -> bool {
        self.kind.chunks_prefill() && self.chunked_prefill
    }

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
        if !self.chunked_prefill && self.kind != SchedulerKind::Chunked {
            return bad(
                "engine.enable_chunked_prefill",
                format!(
                    "false mixes whole prompts into decode steps, which only the chunked scheduler runs (the scheduler is {}; continuous and static prefill whole prompts anyway)",
                    self.kind.as_str()
                ),
            );
        }
        if let Some(m) = self.max_prefill_tokens {
            if m == 0 {
                return bad(
                    "engine.max_prefill_tokens",
                    "must be at least 1 token (omit it for no limit beyond max_num_batched_tokens)"
                        .into(),
                );
            }
            if self.kind != SchedulerKind::Chunked {
                return bad(
                    "engine.max_prefill_tokens",
                    format!(
                        "limits the prompts mixed into decode steps (SGLang's --enable-mixed-chunk), which only the chunked scheduler runs (the scheduler is {}; its prefill budget is max_num_batched_tokens)",
                        self.kind.as_str()
                    ),
                );
            }
        }
        if !self.chunks_prefill() && self.max_num_batched_tokens < self.max_model_len {
            let who = if self.kind.chunks_prefill() {
                "without chunked prefill the chunked".to_string()
            } else {
                format!("the {}", self.kind.as_str())
            };
            return bad(
                "engine.max_num_batched_tokens",
                format!(
                    "({}) must hold the longest sequence (max_model_len, {}): {who} scheduler prefills whole prompts (use chunked prefill or raise the budget)",
                    self.max_num_batched_tokens, self.max_model_len
                ),
            );
        }
        if self.sliding_window == Some(0) {
            return bad(
                "model.sliding_window",
                "must be at least 1 token (omit it for full attention)".into(),
            );
        }
        if self.static_padding && self.kind != SchedulerKind::Static {
            return bad(
                "engine.static_padding",
                format!(
                    "pads a static batch, but the scheduler is {} (set engine.scheduler = \"static\")",
                    self.kind.as_str()
                ),
            );
        }
        if let Some(spec) = &self.speculative {
            if let Err(msg) = spec.validate() {
                return bad("speculative", msg);
            }
        }
        if self.arrival_poll.is_some_and(|p| p.interval == 0) {
            return bad(
                "engine.recv_interval",
                "arrivals must be polled at least every step (interval >= 1)".into(),
            );
        }
        if self.max_concurrent_batches == 0 {
            return bad("engine.max_concurrent_batches", "must be at least 1".into());
        }
        if self.max_concurrent_batches > 1 && self.kind == SchedulerKind::Static {
            return bad(
                "engine.max_concurrent_batches",
                format!(
                    "({}) micro-batches need iteration-level scheduling (engine.scheduler = \"chunked\" or \"continuous\"): a static batch's members start and end together",
                    self.max_concurrent_batches
                ),
            );
        }
        if self.max_concurrent_batches > 1 && self.speculative.is_some() {
            return bad(
                "engine.max_concurrent_batches",
                format!(
                    "({}) overlaps micro-batches, which speculative decoding does not support (set it to 1)",
                    self.max_concurrent_batches
                ),
            );
        }
        if let Some(w) = &self.batch_wait {
            if !(0.0..=1.0).contains(&w.max_tokens_ratio) {
                return bad(
                    "engine.batch_wait_max_tokens_ratio",
                    format!(
                        "must be between 0 and 1 (a share of max_num_batched_tokens), got {}",
                        w.max_tokens_ratio
                    ),
                );
            }
            if self.kind != SchedulerKind::Chunked {
                return bad(
                    "engine.batch_wait_timeout_iters",
                    format!(
                        "batch waiting holds new prompts back from steps that mix them with decodes, which only the chunked scheduler runs (the scheduler is {})",
                        self.kind.as_str()
                    ),
                );
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
    /// FCFS waiting queue (preempted sequences are put back at the front), but the
    /// sequences of requests a step in flight holds (a preempted sibling of a running
    /// parallel sample).
    pub waiting: &'a VecDeque<SeqId>,
    /// Running sequences in admission order (newest last), but those of requests a step
    /// in flight holds (pipelined micro-batches).
    pub running: &'a [SeqId],
    /// Seats (`max_num_seqs`) of the running sequences left out of `running` because a
    /// step in flight holds them.
    pub held_seats: usize,
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
            .sum::<usize>()
            + self.held_seats;
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
            whole: false,
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
    /// Finished sequences of requests with `hold_kv`: taken out of `to_free`, their blocks
    /// stay in use until the driver frees them (a prefill replica's KV being transferred).
    pub held: Vec<SeqId>,
}

/// The scheduler core (a plain struct: time is passed in, effects are returned).
pub struct Scheduler {
    cfg: SchedulerConfig,
    policy: Box<dyn SchedulePolicy + Send>,
    seqs: FxHashMap<SeqId, Sequence>,
    waiting: VecDeque<SeqId>,
    /// The rest of the waiting queue, behind `waiting`. A step looks at no more than
    /// `max_num_seqs + 1` waiting sequences, so the others stay compact (most are still
    /// plain requests) and out of the step's way until they near the head
    /// ([`Scheduler::refill_head`]): a queue of 300,000 requests costs a `Request` each,
    /// not a `Sequence` in a map, nor a sort per step.
    backlog: backlog::Backlog,
    /// Scratch: the head of a keyed queue with its keys, while it is refilled.
    head_keys: Vec<policy::QueueKey>,
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
    /// Requests their clients aborted: each ends at its sequences' next committed step
    /// ([`Scheduler::abort`]).
    aborting: FxHashMap<SeqId, FinishReason>,
    /// Single sequences of parallel-sampling requests ended early (one choice's stop
    /// string): each ends at its next committed step ([`Scheduler::abort_choice`]).
    aborting_seqs: FxHashMap<SeqId, FinishReason>,
    /// Drafts of each entry of the pending proposal (speculative decoding).
    pending_drafts: Vec<Option<crate::spec::Drafts>>,
    /// Acceptance counters per request class.
    spec_stats: Vec<crate::spec::SpecStats>,
    /// The padded static batch in flight (`static_padding`): members and longest prompt.
    pad: PadState,
    /// Requests a planned step holds until its commit, when more than one step may be in
    /// flight (`max_concurrent_batches`): their sequences sit out the steps planned
    /// meanwhile, and are never preempted for them.
    in_flight: rustc_hash::FxHashSet<SeqId>,
    /// A step planned with steps in flight left a running sequence out for want of
    /// blocks it could take only from them: no further step starts until those have
    /// committed (the pipeline drains), so the next one can preempt as a lone step would.
    draining: bool,
    /// Scratch: the running and the waiting sequences no step in flight holds.
    free_running: Vec<SeqId>,
    free_waiting: VecDeque<SeqId>,
    /// Arrivals the scheduler has not polled yet (`arrival_poll`), in arrival order.
    inbox: VecDeque<Request>,
    /// Steps since the last poll (`arrival_poll`).
    recv_counter: u32,
    /// Whether the last planned step computed prompt tokens (it polls after one).
    last_prefilled: bool,
    /// Whether the last proposal planned any work (only steps count toward a poll).
    last_planned: bool,
}

/// What a padded static batch's padding is computed from: its requests (each keeps `n`
/// rows until the batch ends, finished or not), its longest prompt and the decode steps
/// it has run (every row is as long as the longest prompt plus those, under left padding).
#[derive(Debug, Clone, Default)]
struct PadState {
    requests: rustc_hash::FxHashSet<SeqId>,
    rows: u32,
    longest_prompt: u32,
    decode_steps: u32,
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
            backlog: backlog::Backlog::new(cfg.queue, cfg.queue_aging_ns),
            head_keys: Vec::new(),
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
            aborting: Default::default(),
            aborting_seqs: Default::default(),
            in_flight: Default::default(),
            draining: false,
            free_running: Vec::new(),
            free_waiting: VecDeque::new(),
            spec_stats: Vec::new(),
            pad: PadState::default(),
            inbox: VecDeque::new(),
            recv_counter: 0,
            last_prefilled: false,
            last_planned: false,
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
            return Some(never_ran(&req, now, FinishReason::RejectedTooLong));
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
        if self.cfg.arrival_poll.is_some() {
            self.inbox.push_back(req);
        } else {
            self.backlog.push_arrival(req, now);
        }
        None
    }

    /// The poll of [`ArrivalPoll`]: each step the scheduler ran adds 1 to the count (a
    /// proposal that planned nothing adds 0), and the scheduler polls when the count reaches
    /// the interval, or at once when [`ArrivalPoll::after_prefill`]'s release holds. A poll
    /// moves every arrival held back into the queue and restarts the count.
    pub(crate) fn receive(&mut self, now: Nanos) {
        let Some(poll) = self.cfg.arrival_poll else {
            return;
        };
        let interval = poll.interval;
        let idle = self.running.is_empty() && self.waiting.is_empty() && self.backlog.is_empty();
        let release = if poll.after_prefill {
            idle || self.last_prefilled
        } else {
            // TensorRT-LLM releases held prompts on a rank with no generation request.
            let seqs = &self.seqs;
            !self.running.iter().any(|id| {
                seqs.get(id)
                    .is_some_and(|s| s.num_computed >= s.request.prompt_len)
            })
        };
        let weight = if release {
            interval
        } else if self.last_planned {
            1
        } else {
            // A proposal that planned nothing (a re-plan after a preemption, every running
            // sequence held by a step in flight) is not a step the engine ran.
            0
        };
        self.recv_counter = self.recv_counter.saturating_add(weight);
        if self.recv_counter < interval {
            return;
        }
        self.recv_counter = 0;
        for req in self.inbox.drain(..) {
            self.backlog.push_arrival(req, now);
        }
    }

    /// The head of the waiting queue at `now`: its first `max_num_seqs + 1` sequences in
    /// the queue policy's order (all of them for lpm up to [`policy::LPM_MAX_QUEUE`], which
    /// it sorts itself). FCFS and lpm take arrivals in order, so nothing a step can see
    /// changes; the keyed policies sort the head and swap in whatever in the backlog now
    /// ranks before its last, giving back what falls behind.
    pub(crate) fn refill_head(&mut self, now: Nanos) {
        let mut want = self.cfg.max_num_seqs as usize + 1;
        if !self.backlog.keyed() {
            if self.cfg.queue == QueuePolicy::Lpm && self.num_queued() <= policy::LPM_MAX_QUEUE {
                want = usize::MAX;
            }
            while self.waiting.len() < want {
                let Some(backlog::Entry::Fresh(req)) = self.backlog.pop(now) else {
                    break;
                };
                let id = self.new_sequence(req);
                self.waiting.push_back(id);
            }
            return;
        }
        let (policy, aging) = (self.cfg.queue, self.cfg.queue_aging_ns);
        // The backlog's keys are taken at the latest time it saw (time does not go back).
        let now = self.backlog.latest(now);
        let seqs = &self.seqs;
        let mut head = std::mem::take(&mut self.head_keys);
        head.clear();
        head.extend(
            self.waiting
                .drain(..)
                .map(|id| policy.key(id, &seqs[&id], now, aging)),
        );
        // Keys are unique (they end with the sequence id); the head is mostly in order.
        if !head.is_sorted() {
            head.sort_unstable();
        }
        while head.len() > want {
            self.give_back(&mut head, now);
        }
        while let Some(next) = self.backlog.peek_key(now) {
            if head.len() >= want && head.last().is_some_and(|&last| next > last) {
                break;
            }
            let id = match self.backlog.pop(now) {
                Some(backlog::Entry::Fresh(req)) => self.new_sequence(req),
                Some(backlog::Entry::Seq(id)) => id,
                None => break,
            };
            debug_assert_eq!(id, next.3);
            let at = head.partition_point(|&k| k < next);
            head.insert(at, next);
            if head.len() > want {
                self.give_back(&mut head, now);
            }
        }
        self.waiting.extend(head.iter().map(|k| k.3));
        self.head_keys = head;
    }

    /// Invariant check of the queue after [`Scheduler::propose`] at `now` (property tests):
    /// the head holds `max_num_seqs + 1` sequences when more wait and, under a keyed
    /// policy, is sorted by key and ranks before everything in the backlog.
    pub fn check_queue_order(&mut self, now: Nanos) -> Result<(), String> {
        let want = self.cfg.max_num_seqs as usize + 1;
        if !self.backlog.is_empty() && self.waiting.len() < want {
            return Err(format!(
                "head of {} with {} more waiting behind it (want {want})",
                self.waiting.len(),
                self.backlog.len()
            ));
        }
        if !self.backlog.keyed() {
            return Ok(());
        }
        let (policy, aging) = (self.cfg.queue, self.cfg.queue_aging_ns);
        let keys: Vec<_> = self
            .waiting
            .iter()
            .map(|&id| policy.key(id, &self.seqs[&id], now, aging))
            .collect();
        if !keys.is_sorted() {
            return Err(format!("head out of order at {now}: {keys:?}"));
        }
        match (keys.last(), self.backlog.peek_key(now)) {
            (Some(last), Some(next)) if next < *last => Err(format!(
                "backlog key {next:?} ranks before the head's last {last:?} at {now}"
            )),
            _ => Ok(()),
        }
    }

    /// The head's last sequence goes back to the backlog.
    fn give_back(&mut self, head: &mut Vec<policy::QueueKey>, now: Nanos) {
        if let Some((.., id)) = head.pop() {
            self.backlog.push_seq(id, &self.seqs[&id].request, now);
        }
    }

    /// A request becomes a waiting sequence (its prompt's block hashes computed for the
    /// prefix cache); returns its id.
    fn new_sequence(&mut self, req: Request) -> SeqId {
        let id = req.id;
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
        id
    }

    /// Ends a live request early: its client hung up (`reason` [`FinishReason::Abort`]) or
    /// a stop string matched in its text ([`FinishReason::Stop`]). A request still queued
    /// and never scheduled (one sequence, under a first-come queue) leaves the queue now:
    /// its record is returned, ended at `now`. Any other ends at its sequences' next
    /// committed step with that reason, its blocks freed with the step's (a request queued
    /// under a keyed policy at its first step). Ids of requests not live must not be
    /// passed: they would stay in the map.
    pub fn abort(
        &mut self,
        request: SeqId,
        reason: FinishReason,
        now: Nanos,
    ) -> Option<RequestRecord> {
        if !self.groups.contains_key(&request) {
            if let Some(i) = self.inbox.iter().position(|r| r.id == request) {
                let req = self.inbox.remove(i)?;
                return Some(never_ran(&req, now.max(req.arrival), reason));
            }
        }
        if !self.backlog.keyed() && !self.groups.contains_key(&request) {
            let queued = |r: &Request| r.id == request;
            if let Some(req) = self.backlog.remove_fresh(queued) {
                return Some(never_ran(&req, now.max(req.arrival), reason));
            }
            let unscheduled = self
                .seqs
                .get(&request)
                .is_some_and(|s| s.status == SeqStatus::Waiting && s.num_computed == 0);
            if unscheduled {
                if let Some(i) = self.waiting.iter().position(|&id| id == request) {
                    self.waiting.remove(i);
                    let rec = self.finish(request, reason, now);
                    self.seqs.remove(&request);
                    return rec.map(|r| RequestRecord {
                        finish_ns: now.max(r.arrival_ns),
                        ..r
                    });
                }
            }
        }
        self.aborting.insert(request, reason);
        None
    }

    /// Ends choice `index` of a live request early (`sim serve`: a stop string matched in
    /// that choice's text while the others go on): its sequence ends at its next committed
    /// step with `reason`, its blocks freed then; the request's record comes when its last
    /// sequence ends. Choice 0 is the request's own sequence, choice `k` its fork
    /// [`child_id`]`(request, k)`. A choice that is not live (never forked, or already
    /// ended) is left alone.
    pub fn abort_choice(&mut self, request: SeqId, index: u32, reason: FinishReason) {
        let seq = if index == 0 {
            request
        } else {
            child_id(request, index)
        };
        let live = self
            .seqs
            .get(&seq)
            .is_some_and(|s| s.status != SeqStatus::Finished && s.request.id == request);
        if live {
            self.aborting_seqs.insert(seq, reason);
        }
    }

    /// True when some sequence waits or runs.
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty()
            || !self.backlog.is_empty()
            || !self.running.is_empty()
            || !self.inbox.is_empty()
    }

    /// Requests waiting (arrivals not yet at the queue's head, or not yet polled,
    /// included).
    pub fn num_waiting(&self) -> usize {
        self.num_queued() + self.inbox.len()
    }

    /// Requests in the waiting queue the scheduler has taken in (not those it has not
    /// polled yet): what SGLang's lpm policy counts.
    pub(crate) fn num_queued(&self) -> usize {
        self.waiting.len() + self.backlog.len()
    }

    /// Sequences running.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Live sequences (waiting or running) and arrivals.
    pub fn num_live(&self) -> usize {
        self.seqs.len() + self.backlog.len() + self.inbox.len()
    }

    /// The head of the waiting queue (preempted sequences included) in queue order, as the
    /// last step saw it: up to `max_num_seqs + 1` sequences when more wait.
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
}

/// The record of a request that ended at `now` without running (rejected, or aborted in
/// the queue).
fn never_ran(req: &Request, now: Nanos, reason: FinishReason) -> RequestRecord {
    RequestRecord {
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
        finish_reason: reason,
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
    } else if s.request.stops_at(token, s.output_len, eos) {
        Some(FinishReason::Stop)
    } else {
        None
    }
}

/// Why sequence `seq` of `request` must end now, if it was aborted (the whole request in
/// `requests`, or this one sequence in `seqs`).
fn aborted(
    requests: &FxHashMap<SeqId, FinishReason>,
    seqs: &FxHashMap<SeqId, FinishReason>,
    request: SeqId,
    seq: SeqId,
) -> Option<FinishReason> {
    requests.get(&request).or_else(|| seqs.get(&seq)).copied()
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
