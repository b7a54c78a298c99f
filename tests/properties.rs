//! Property tests of the engine's invariants (DESIGN §3) for every scheduler kind.
//!
//! The cores (scheduler, block manager, a fake backend) are driven by a small discrete-event
//! loop of our own that follows `sim::driver::run`'s event order: a min-heap on
//! `(time, sequence number)`, arrivals pulled one at a time, one step in flight, and a step
//! planned only after every event at the current instant was handled. After every step the
//! harness checks invariants 1, 2, 4, 5, 6 and 8; at the end of a run 6, 7, 8 and 9; each
//! case runs twice for 11. A last property runs the real driver with both handles
//! (inline and actors) over the cost model and compares the CSV bytes they write.

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::fmt::Display;
use std::io::Write;
use std::rc::Rc;

use analysis::{RunCollector, RunInfo};
use engine::backend::{Backend, BackendError};
use engine::block_manager::offload::{OffloadPolicy, OffloadStore};
use engine::block_manager::{BlockManager, SideGroup, NULL_BLOCK};
use engine::eviction::EvictionKind;
use engine::plan::{StepOutcome, StepPlan, WorkKind};
use engine::record::{RequestRecord, StepRecord};
use engine::request::{FinishReason, Nanos, Request, SeqId, SeqStatus};
use engine::scheduler::{
    AdmissionPolicy, ArrivalPoll, BatchWait, QueuePolicy, Scheduler, SchedulerConfig,
    SchedulerKind, VictimPolicy,
};
use engine::spec::{Acceptance, DynamicK, Method, SpecConfig};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use sim::catalog::{find_gpu, find_model, Dtype};
use sim::cost_model::{CostModel, CostModelBackend, CostParams, Deployment};
use sim::driver::{run_to_end, DriverKind};
use sim::workload::WorkloadError;

// ---------------------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------------------

/// Turns any error into a test failure.
fn fail(e: impl Display) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

/// Proptest settings: `cases` cases, no regression files written next to the sources.
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A backend whose step time is derived from the plan: 1000 ns + 10 ns per token, and one
/// sampled token per sampling sequence.
struct FakeBackend;

impl Backend for FakeBackend {
    fn name(&self) -> &str {
        "fake"
    }

    fn execute(&mut self, plan: &StepPlan) -> Result<StepOutcome, BackendError> {
        let duration = 1000 + 10 * u64::from(plan.num_batched_tokens());
        Ok(StepOutcome {
            // Two pipeline stages: a micro-batch may follow once the first is done.
            interval: duration / 2,
            ..StepOutcome::simulated(plan, duration)
        })
    }
}

/// Engine knobs of one run, before the scheduler kind is chosen.
#[derive(Debug, Clone)]
struct Knobs {
    block_size: u32,
    num_blocks: u32,
    max_model_len: u32,
    max_num_seqs: u32,
    /// Token budget asked for; raised to what `SchedulerConfig::validate` needs for a kind.
    budget: u32,
    /// Ask for block tables in plans (and keep generated tokens).
    want_tables: bool,
    /// Prefix caching (LRU) on: prompts share token prefixes by family.
    prefix: bool,
    /// CPU swap pool in blocks: preemption swaps while it has room.
    swap_blocks: Option<u32>,
    /// Waiting-queue order (FCFS checks invariant 8; the others reorder and, for
    /// `priority`, preempt).
    queue: QueuePolicy,
    /// Sliding attention window in tokens (blocks before it are freed).
    window: Option<u32>,
    /// One contiguous run of blocks per sequence (no prefix caching, swap or window then).
    contiguous: bool,
    /// Blocks kept free when admitting (vLLM V0's watermark).
    watermark: u32,
    /// Speculative decoding with synthetic acceptance: `(k, per-position rates, dynamic
    /// k's zero batch)`.
    spec: Option<(u32, Vec<f64>, Option<u32>)>,
    /// A hybrid model's layer groups beside the main table (sliding windows, linear
    /// states), and the most pages they hold for one sequence (kept out of `pool_tokens`).
    side: Vec<SideGroup>,
    side_pages: u32,
    /// The prefix cache's eviction policy.
    eviction: EvictionKind,
    /// A CPU offload tier under the prefix cache: `(blocks, store, policy, disk blocks)`
    /// (a disk tier under it when the last is not 0).
    offload: Option<(u32, OffloadStore, OffloadPolicy, u32)>,
    /// Steps in flight at once (pipelined micro-batches, `max_concurrent_batches`); 1
    /// without speculative decoding's drafts only.
    batches: u32,
    /// TensorRT-LLM's batch waiting `(timeout steps, token ratio)` (chunked runs only).
    batch_wait: Option<(u32, f64)>,
    /// Arrivals polled every so many steps, and after each prefill or not (SGLang's
    /// receive interval, TensorRT-LLM's attention-DP timeout).
    poll: Option<(u32, bool)>,
    /// Whole prompts only (`chunked_prefill = false`; chunked runs only, whose budget is
    /// then raised to the longest sequence).
    whole_prompts: bool,
    /// SGLang's mixed chunks under this `max_prefill_tokens` (chunked runs only).
    prefill_limit: Option<u32>,
}

impl Knobs {
    /// Plain knobs: FCFS, no prefix caching, swap, window, contiguous allocator or
    /// watermark, no block tables.
    fn plain(
        block_size: u32,
        num_blocks: u32,
        max_model_len: u32,
        max_num_seqs: u32,
        budget: u32,
    ) -> Self {
        Knobs {
            block_size,
            num_blocks,
            max_model_len,
            max_num_seqs,
            budget,
            want_tables: false,
            prefix: false,
            swap_blocks: None,
            queue: QueuePolicy::Fcfs,
            window: None,
            contiguous: false,
            watermark: 0,
            spec: None,
            side: Vec::new(),
            side_pages: 0,
            eviction: EvictionKind::Lru,
            offload: None,
            batches: 1,
            batch_wait: None,
            poll: None,
            whole_prompts: false,
            prefill_limit: None,
        }
    }
}

/// The block manager the knobs ask for.
fn block_manager(k: &Knobs) -> BlockManager {
    if k.contiguous {
        return BlockManager::new(k.num_blocks, k.block_size)
            .with_contiguous_allocation()
            .with_side_groups(k.side.clone());
    }
    let bm = if k.prefix {
        BlockManager::with_prefix_caching(k.num_blocks, k.block_size, k.eviction.policy())
    } else {
        BlockManager::new(k.num_blocks, k.block_size)
    };
    let bm = bm.with_side_groups(k.side.clone());
    let bm = match k.window {
        Some(w) => bm.with_sliding_window(w),
        None => bm,
    };
    let bm = match k.offload {
        Some((n, store, policy, disk)) => bm
            .with_offload(n, store, policy)
            .with_disk_tier(disk, policy),
        None => bm,
    };
    match k.swap_blocks {
        Some(n) => bm.with_swap_space(n),
        None => bm,
    }
}

impl Knobs {
    /// The scheduler configuration for `kind`, valid by construction.
    fn config(&self, kind: SchedulerKind) -> SchedulerConfig {
        let whole = self.whole_prompts && kind == SchedulerKind::Chunked;
        let floor = if kind.chunks_prefill() && !whole {
            self.max_num_seqs
        } else {
            self.max_num_seqs.max(self.max_model_len)
        };
        SchedulerConfig {
            kind,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.budget.max(floor),
            max_model_len: self.max_model_len,
            pool_tokens: u64::from(self.num_blocks - self.side_pages) * u64::from(self.block_size),
            eos_token: None,
            want_block_tables: self.want_tables,
            keep_tokens: self.want_tables,
            block_size: self.block_size,
            prefix_caching: self.prefix,
            queue: self.queue,
            queue_aging_ns: 10_000,
            admission: AdmissionPolicy::Optimistic,
            victim: VictimPolicy::Newest,
            watermark_blocks: self.watermark,
            sliding_window: self.window,
            speculative: self.spec.as_ref().map(|(k, rates, zero_at)| SpecConfig {
                method: Method::Synthetic,
                k: *k,
                acceptance: Acceptance::from_rates(rates).expect("rates"),
                class_acceptance: Vec::new(),
                ngram_min: 1,
                ngram_max: 3,
                dynamic: match zero_at {
                    Some(z) => DynamicK::Linear {
                        full_until: 1,
                        zero_at: (*z).max(2),
                    },
                    None => DynamicK::Off,
                },
            }),
            // Half the static runs pad their batches as HF `generate` does (a cost
            // only: the schedule must be the same).
            static_padding: kind == SchedulerKind::Static && self.max_num_seqs.is_multiple_of(2),
            // (sim refuses micro-batches with drafts, the contiguous allocator or static
            // batching.)
            max_concurrent_batches: if self.spec.is_some()
                || self.contiguous
                || kind == SchedulerKind::Static
            {
                1
            } else {
                self.batches
            },
            batch_wait: self
                .batch_wait
                .filter(|_| kind == SchedulerKind::Chunked)
                .map(|(timeout_iters, max_tokens_ratio)| BatchWait {
                    timeout_iters,
                    max_tokens_ratio,
                }),
            arrival_poll: self.poll.map(|(interval, after_prefill)| ArrivalPoll {
                interval,
                after_prefill,
            }),
            chunked_prefill: !whole,
            max_prefill_tokens: self
                .prefill_limit
                .filter(|_| kind == SchedulerKind::Chunked),
        }
    }
}

/// Builds requests (ids in arrival order) from `(gap, prompt_len, max_tokens)` triples.
fn requests_from(spec: &[(Nanos, u32, u32)]) -> Vec<Request> {
    let mut t = 0;
    spec.iter()
        .enumerate()
        .map(|(i, &(gap, prompt_len, max_tokens))| {
            t += gap;
            // Three families share token prefixes (a third of the requests a family each):
            // the first half of a prompt is the family's, the rest the request's own.
            let family = (i % 3) as u32;
            let prompt_tokens = (0..prompt_len)
                .map(|p| {
                    if p < prompt_len / 2 {
                        family * 100_000 + p
                    } else {
                        (i as u32 + 3) * 100_000 + p
                    }
                })
                .collect();
            Request {
                prompt_tokens,
                priority: (i % 4) as i32,
                ..Request::new(i as SeqId, t, prompt_len, max_tokens)
            }
        })
        .collect()
}

/// Arrival gaps: many ties at the same nanosecond, short gaps (comparable to a step) and
/// a few long idle periods.
fn gap() -> impl Strategy<Value = Nanos> {
    prop_oneof![
        3 => Just(0u64),
        1 => Just(1000u64),
        3 => 0u64..3_000,
        1 => 0u64..200_000,
    ]
}

/// A random workload for a model of `max_model_len` tokens; some requests are too long and
/// must be rejected.
fn workload(max_model_len: u32, max_requests: usize) -> impl Strategy<Value = Vec<Request>> {
    let half = (max_model_len / 2).max(1);
    let prompt = prop_oneof![4 => 1..=half, 1 => 1..=max_model_len];
    let output = prop_oneof![3 => 1..=half, 2 => 1u32..=4, 1 => 1..=max_model_len];
    prop::collection::vec((gap(), prompt, output), 1..=max_requests)
        .prop_map(|spec| requests_from(&spec))
}

/// Random knobs: block sizes 1..=32 (powers of two), pools from "exactly one max-length
/// sequence" (forcing preemption) to roomy, budgets from tiny (chunked) to several prompts.
fn knobs() -> impl Strategy<Value = Knobs> {
    (
        0u32..=5,
        4u32..=128,
        1u32..=8,
        prop_oneof![3 => Just(0u32), 2 => 0u32..=4, 1 => 0u32..=64],
        any::<bool>(),
        any::<bool>(),
        0u32..=1024,
        any::<bool>(),
        prop_oneof![2 => Just(None), 1 => (0u32..=3).prop_map(Some)],
        prop_oneof![
            4 => Just(QueuePolicy::Fcfs),
            1 => Just(QueuePolicy::Priority),
            1 => Just(QueuePolicy::Sjf),
            1 => Just(QueuePolicy::Lpm),
        ],
        (
            prop_oneof![3 => Just(None), 1 => (1u32..=48).prop_map(Some)],
            prop_oneof![4 => Just(false), 1 => Just(true)],
            prop_oneof![3 => Just(0u32), 1 => 1u32..=3],
            prop_oneof![
                2 => Just(None),
                1 => (
                    1u32..=5,
                    prop::collection::vec(0.0f64..=1.0, 1..=5),
                    prop_oneof![Just(None), (2u32..=8).prop_map(Some)],
                )
                    .prop_map(|(k, mut r, z)| {
                        // Unconditional rates are non-increasing.
                        r.sort_by(|a, b| b.total_cmp(a));
                        Some((k, r, z))
                    }),
            ],
            side_layout(),
            prop_oneof![
                Just(EvictionKind::Lru),
                Just(EvictionKind::Fifo),
                Just(EvictionKind::Lfu),
                Just(EvictionKind::Slru),
            ],
        ),
    )
        .prop_map(
            |(
                bs_exp,
                max_model_len,
                max_num_seqs,
                extra_blocks,
                small_budget,
                want_tables,
                r,
                prefix,
                swap,
                queue,
                (window, contiguous, watermark, spec, side, eviction),
            )| {
                let block_size = 1 << bs_exp;
                // A hybrid layout's side tables hold at most a window and a step's tokens
                // (a whole prompt for the schedulers that do not chunk, and the drafts'
                // slots) or their states: the pool has room for them beside one
                // max-length sequence.
                let chunk = max_model_len + 5;
                let side_pages = BlockManager::new(1, block_size)
                    .with_side_groups(side.clone())
                    .max_side_pages(chunk);
                // Small: 1..=max_model_len (chunked only; others are raised to the floor);
                // large: max_model_len..=3 x max_model_len.
                let budget = budget_of(small_budget, r, max_model_len);
                Knobs {
                    block_size,
                    num_blocks: max_model_len.div_ceil(block_size) + extra_blocks + side_pages,
                    max_model_len,
                    max_num_seqs,
                    budget,
                    want_tables,
                    prefix: prefix && !contiguous,
                    // 0 to 3 max-length sequences of CPU blocks (0: every swap falls back
                    // to recompute).
                    swap_blocks: swap
                        .filter(|_| !contiguous)
                        .map(|k| k * max_model_len.div_ceil(block_size)),
                    queue,
                    // Sliding layers are a side group when the layout is hybrid.
                    window: window.filter(|_| !contiguous && side.is_empty()),
                    contiguous,
                    watermark,
                    spec,
                    // The contiguous allocator predates hybrid layouts (sim refuses both).
                    side: if contiguous { Vec::new() } else { side },
                    side_pages: if contiguous { 0 } else { side_pages },
                    eviction,
                    // A CPU tier under the prefix cache for every other draw (no new
                    // dimension: the strategy's tuples are full), 1 to 12 blocks a
                    // max-length sequence, the store and policy by the draw's parity,
                    // and a disk tier of twice its size under every third.
                    offload: (prefix && !contiguous && r % 2 == 1).then(|| {
                        let blocks = (1 + r % 12) * max_model_len.div_ceil(block_size);
                        let store = if r % 4 == 1 {
                            OffloadStore::WriteThrough
                        } else {
                            OffloadStore::OnEvict
                        };
                        let policy = if (r / 4) % 2 == 0 {
                            OffloadPolicy::Lru
                        } else {
                            OffloadPolicy::Arc
                        };
                        let disk = if r % 3 == 0 { 2 * blocks } else { 0 };
                        (blocks, store, policy, disk)
                    }),
                    // One, two or three micro-batches in flight, by the same draw.
                    batches: 1 + (r / 8) % 3,
                    // Batch waiting in every fifth chunked run: up to 5 steps, a
                    // quarter to all of the budget.
                    batch_wait: (r % 5 == 2).then(|| (r % 6, f64::from(1 + r % 4) / 4.0)),
                    // Arrivals polled every 1 to 5 steps in every seventh run, after each
                    // prefill in half of those.
                    poll: (r % 7 == 3).then(|| (1 + r % 5, r % 2 == 0)),
                    // Whole prompts only in every third run (chunked runs only).
                    whole_prompts: r % 3 == 1,
                    // SGLang's mixed chunks in every eleventh run, the limit from one
                    // token to twice the longest sequence.
                    prefill_limit: (r % 11 == 4).then(|| 1 + r % (2 * max_model_len)),
                }
            },
        )
}

/// Small: 1..=max_model_len (chunked only; others are raised to the floor); large:
/// max_model_len..=3 x max_model_len.
fn budget_of(small: bool, r: u32, max_model_len: u32) -> u32 {
    if small {
        1 + r % max_model_len
    } else {
        max_model_len + r % (2 * max_model_len + 1)
    }
}

/// Hybrid layouts: none (most cases), a sliding group, a linear-state group, or both
/// (gpt-oss, Qwen3.5, and a model with both kinds beside its full-attention layers).
fn side_layout() -> impl Strategy<Value = Vec<SideGroup>> {
    let sliding = (1u32..=48).prop_map(|window| SideGroup::Sliding { window });
    let state = (1u32..=2).prop_map(|pages| SideGroup::State { pages });
    prop_oneof![
        3 => Just(Vec::new()),
        1 => sliding.clone().prop_map(|g| vec![g]),
        1 => state.clone().prop_map(|g| vec![g]),
        1 => (sliding, state).prop_map(|(a, b)| vec![a, b]),
    ]
}

/// Knobs and a workload that fits them.
fn case(max_requests: usize) -> impl Strategy<Value = (Knobs, Vec<Request>)> {
    (knobs(), prop_oneof![3 => Just(false), 1 => Just(true)]).prop_flat_map(move |(k, parallel)| {
        let len = k.max_model_len;
        let requests = workload(len, max_requests).prop_map(move |mut reqs| {
            if parallel {
                // Parallel sampling: n = 1, 2, 3 in turn (forks, copy-on-write); every
                // other multi-sequence request searches beams instead.
                for (i, r) in reqs.iter_mut().enumerate() {
                    r.n = 1 + (i % 3) as u32;
                    r.beam_search = r.n > 1 && i % 2 == 0;
                }
            }
            reqs
        });
        (Just(k), requests)
    })
}

/// The requests with one sequence each (for properties that hold only then).
fn single(requests: &[Request]) -> Vec<Request> {
    requests
        .iter()
        .map(|r| Request {
            n: 1,
            beam_search: false,
            ..r.clone()
        })
        .collect()
}

/// The request a sequence belongs to (parallel-sampling children carry their index above
/// bit 40).
fn request_of(seq: SeqId) -> SeqId {
    seq & ((1 << 40) - 1)
}

// ---------------------------------------------------------------------------------------
// The harness
// ---------------------------------------------------------------------------------------

/// One planned step as the harness saw it.
#[derive(Debug, Clone, PartialEq)]
struct StepTrace {
    /// The plan (work, block tables when asked, preempted sequences).
    plan: StepPlan,
    /// Running set before planning, in admission order.
    running_before: Vec<SeqId>,
    /// Running set after planning.
    running_after: Vec<SeqId>,
    /// Budget in force.
    budget: u32,
    /// Whole prompts only (`chunked_prefill = false`).
    whole: bool,
    /// SGLang's `max_prefill_tokens`.
    prefill_limit: Option<u32>,
    /// Running sequences of requests no step in flight held that sat the step out without
    /// being preempted (`defer_stuck`: out of blocks with pipelined micro-batches).
    deferred: bool,
}

impl StepTrace {
    /// Sequences that joined the running set in this step.
    fn admitted(&self) -> Vec<SeqId> {
        self.running_after
            .iter()
            .copied()
            .filter(|s| !self.running_before.contains(s))
            .collect()
    }
}

/// Everything a run produced.
#[derive(Debug, Clone, PartialEq)]
struct Run {
    /// Records in the order the requests ended.
    records: Vec<RequestRecord>,
    /// Every planned step (also empty ones), in order.
    steps: Vec<StepTrace>,
    /// The rows `sim::driver::run` would write to steps.csv (non-empty steps).
    step_records: Vec<StepRecord>,
    /// Preemptions over the run.
    preemptions: u64,
    /// Of those, preemptions that swapped the victim out.
    swaps: u64,
    /// Whether batches were padded (`static_padding`).
    padded: bool,
}

/// Driver events. The derived order never decides: heap keys carry a unique sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Arrival(usize),
    StepDone,
    Wake,
}

/// A verify work before its commit: `(seq, k, accepted, output_len, table length before
/// the step)`.
type VerifyBefore = (SeqId, u32, u32, u32, usize);

/// The harness: the cores plus the bookkeeping the checks need.
struct Harness<'a> {
    cfg: SchedulerConfig,
    sched: Scheduler,
    bm: BlockManager,
    backend: FakeBackend,
    requests: &'a [Request],
    by_id: BTreeMap<SeqId, &'a Request>,
    ended: BTreeSet<SeqId>,
    preempted: BTreeMap<SeqId, u32>,
    /// Requests with more than one sequence (their copies break contiguity).
    forked: BTreeSet<SeqId>,
    /// Block-table lengths of the running sequences before the step in flight was planned.
    tables_before: BTreeMap<SeqId, usize>,
    run: Run,
}

impl<'a> Harness<'a> {
    fn new(
        knobs: &Knobs,
        kind: SchedulerKind,
        requests: &'a [Request],
    ) -> Result<Self, TestCaseError> {
        let cfg = knobs.config(kind);
        let sched = Scheduler::new(cfg.clone()).map_err(fail)?;
        Ok(Harness {
            sched,
            bm: block_manager(knobs),
            backend: FakeBackend,
            requests,
            by_id: requests.iter().map(|r| (r.id, r)).collect(),
            ended: BTreeSet::new(),
            preempted: BTreeMap::new(),
            forked: requests.iter().filter(|r| r.n > 1).map(|r| r.id).collect(),
            tables_before: BTreeMap::new(),
            run: Run {
                records: Vec::new(),
                steps: Vec::new(),
                step_records: Vec::new(),
                preemptions: 0,
                swaps: 0,
                padded: cfg.static_padding,
            },
            cfg,
        })
    }

    fn should_reject(&self, r: &Request) -> bool {
        let total = u64::from(r.prompt_len) + u64::from(r.max_tokens);
        r.prompt_len == 0
            || total > u64::from(self.cfg.max_model_len)
            || total > self.cfg.pool_tokens
            || r.n > self.cfg.max_num_seqs
    }

    /// The event loop of `sim::driver::run`, with checks. Fails on any violated invariant,
    /// on a stall (work left, nothing scheduled, no event pending) and when the run takes
    /// more steps than the liveness bound.
    fn simulate(mut self) -> Result<Run, TestCaseError> {
        let total_tokens: u64 = self
            .requests
            .iter()
            .map(|r| u64::from(r.prompt_len) + u64::from(r.max_tokens))
            .sum();
        let max_steps = 10 * total_tokens + 1000;
        let mut heap: BinaryHeap<Reverse<(Nanos, u64, Event)>> = BinaryHeap::new();
        let mut next_seq = 0u64;
        let mut push = |heap: &mut BinaryHeap<_>, t: Nanos, ev: Event| {
            heap.push(Reverse((t, next_seq, ev)));
            next_seq += 1;
        };
        if !self.requests.is_empty() {
            push(&mut heap, self.requests[0].arrival, Event::Arrival(0));
        }
        // Steps in flight, oldest first: one at a time, or up to `max_concurrent_batches`
        // micro-batches, each started once the last one's first stage is over (the
        // backend's `interval`) and ending at least that long after the one ahead of it,
        // as `sim::driver` runs them.
        let batches = self.sched.config().max_concurrent_batches as usize;
        let mut in_flight: std::collections::VecDeque<(StepPlan, StepOutcome)> =
            std::collections::VecDeque::new();
        let (mut stage_free, mut last_done, mut wake_at) = (0, 0, None);
        let mut last_now = 0;
        while let Some(Reverse((now, _, ev))) = heap.pop() {
            prop_assert!(
                now >= last_now,
                "time ran back from {} to {}",
                last_now,
                now
            );
            last_now = now;
            match ev {
                Event::Arrival(i) => {
                    let req = self.requests[i].clone();
                    if let Some(rec) = self.sched.add_request(req, now) {
                        self.on_end(rec)?;
                    }
                    if let Some(next) = self.requests.get(i + 1) {
                        push(&mut heap, next.arrival.max(now), Event::Arrival(i + 1));
                    }
                }
                Event::Wake => {}
                Event::StepDone => {
                    let Some((plan, outcome)) = in_flight.pop_front() else {
                        return Err(fail("StepDone without a step in flight"));
                    };
                    // The blocks of a step's sequences stayed theirs while it was in
                    // flight, whatever the steps planned meanwhile did.
                    let bs = u64::from(self.bm.block_size());
                    for w in &plan.work {
                        prop_assert!(
                            self.bm.table(w.seq).len() as u64 * bs >= u64::from(w.context_len()),
                            "step {}: seq {} lost blocks while in flight",
                            plan.step,
                            w.seq
                        );
                    }
                    let before = self.verify_state(&plan, &outcome)?;
                    let result = self.sched.commit(&plan, &outcome, now).map_err(fail)?;
                    self.bm.release(
                        &result.cache,
                        &result.rollback,
                        &result.forks,
                        &result.to_free,
                    );
                    self.check_verify(&before)?;
                    let _gaps: Vec<Nanos> = self.sched.take_itl_gaps().collect();
                    for rec in result.finished {
                        self.on_end(rec)?;
                    }
                    self.check_after_commit()?;
                }
            }
            let same_instant = heap.peek().is_some_and(|Reverse((t, _, _))| *t == now);
            if in_flight.len() >= batches || same_instant || !self.sched.has_work() {
                continue;
            }
            if now < stage_free {
                // The first stage is busy: try again when it frees.
                if wake_at != Some(stage_free) {
                    wake_at = Some(stage_free);
                    push(&mut heap, stage_free, Event::Wake);
                }
                continue;
            }
            // The requests the steps in flight hold: a new step neither runs nor preempts
            // their sequences.
            let held: BTreeSet<SeqId> = in_flight
                .iter()
                .flat_map(|(p, _)| p.work.iter().map(|w| request_of(w.seq)))
                .collect();
            let running_before = self.sched.running().to_vec();
            self.tables_before = running_before
                .iter()
                .map(|&s| (s, self.bm.table(s).len()))
                .collect();
            let req = self.sched.propose(now);
            self.sched.check_queue_order(now).map_err(fail)?;
            let resp = self.bm.reserve(&req);
            let blocks_used = resp.blocks_used;
            prop_assert_eq!(blocks_used, self.bm.num_used());
            let plan = self.sched.apply(&req, resp, now);
            self.check_after_apply(&plan)?;
            for id in plan
                .work
                .iter()
                .map(|w| w.seq)
                .chain(plan.preempted.iter().copied())
            {
                prop_assert!(
                    !held.contains(&request_of(id)),
                    "step {}: seq {} of a request in flight is scheduled or preempted",
                    plan.step,
                    id
                );
            }
            let deferred = running_before.iter().any(|&id| {
                !held.contains(&request_of(id))
                    && !plan.work.iter().any(|w| w.seq == id)
                    && !plan.preempted.contains(&id)
            });
            self.run.steps.push(StepTrace {
                plan: plan.clone(),
                running_before,
                running_after: self.sched.running().to_vec(),
                budget: self.cfg.max_num_batched_tokens,
                whole: !self.cfg.chunked_prefill,
                prefill_limit: self.cfg.max_prefill_tokens,
                deferred: deferred && !held.is_empty(),
            });
            prop_assert!(
                (self.run.steps.len() as u64) <= max_steps,
                "liveness: {} steps without draining (bound {})",
                self.run.steps.len(),
                max_steps
            );
            let transfers = plan.has_transfers();
            if plan.is_empty() && !transfers && !plan.preempted.is_empty() {
                // Only preemptions (a contiguous run that could not grow): the driver
                // records them and plans again at once.
                self.record_step(&plan, &StepOutcome::default(), blocks_used);
                push(&mut heap, now, Event::Wake);
                continue;
            }
            if plan.is_empty() && !transfers {
                prop_assert!(
                    !heap.is_empty(),
                    "stalled at {} ns: {} waiting, {} running, nothing scheduled, no event pending; waiting {:?}; pool {:?}",
                    now,
                    self.sched.num_waiting(),
                    self.sched.num_running(),
                    self.sched.waiting().collect::<Vec<_>>(),
                    self.bm
                );
                continue;
            }
            let outcome = self.backend.execute(&plan).map_err(fail)?;
            let mut done = now + outcome.duration.max(1);
            stage_free = done;
            if batches > 1 && outcome.interval > 0 {
                done = done.max(last_done + outcome.interval);
                last_done = done;
                stage_free = now + outcome.interval;
                let recorded = StepOutcome {
                    duration: done - now,
                    ..outcome.clone()
                };
                self.record_step(&plan, &recorded, blocks_used);
            } else {
                self.record_step(&plan, &outcome, blocks_used);
            }
            push(&mut heap, done, Event::StepDone);
            in_flight.push_back((plan, outcome));
            if in_flight.len() < batches {
                wake_at = Some(stage_free);
                push(&mut heap, stage_free, Event::Wake);
            }
        }
        self.check_end()?;
        Ok(self.run)
    }

    /// The steps.csv row of a step, as `sim::driver::run` builds it.
    fn record_step(&mut self, plan: &StepPlan, outcome: &StepOutcome, blocks_used: u32) {
        let decode: u32 = plan
            .work
            .iter()
            .filter(|w| w.kind != WorkKind::Prefill)
            .map(|w| w.len)
            .sum();
        let batched = plan.num_batched_tokens();
        self.run.step_records.push(StepRecord {
            step: plan.step,
            start_ns: plan.start,
            duration_ns: outcome.duration,
            num_seqs: plan.work.len() as u32,
            num_batched_tokens: batched,
            num_prefill_tokens: batched - decode,
            num_decode_tokens: decode,
            num_waiting: self.sched.num_waiting() as u32,
            num_running: self.sched.num_running() as u32,
            num_preempted: plan.preempted.len() as u32,
            kv_blocks_used: blocks_used,
            kv_usage: f64::from(blocks_used) / f64::from(self.bm.num_blocks().max(1)),
            mbu: outcome.mbu,
            mfu: outcome.mfu,
            kv_tokens: self.sched.kv_tokens(),
            kv_slots: u64::from(blocks_used) * u64::from(self.bm.block_size()),
            num_swapped: self.sched.last_step_stats().num_swapped,
            swap_in_blocks: plan.swap_in.len() as u32,
            swap_out_blocks: plan.swap_out.len() as u32,
            block_copies: plan.block_copies.len() as u32,
            recomputed_tokens: self.sched.last_step_stats().recomputed_tokens,
            kv_external_fragmentation: self.sched.last_step_stats().external_fragmentation,
        });
    }

    /// Invariant 6 for one record: ends once, lengths and reason right, times ordered,
    /// preemptions counted right.
    fn on_end(&mut self, rec: RequestRecord) -> Result<(), TestCaseError> {
        let id = rec.request_id;
        prop_assert!(self.ended.insert(id), "request {} ended twice", id);
        let Some(&req) = self.by_id.get(&id) else {
            return Err(fail(format!("record for unknown request {id}")));
        };
        prop_assert!(
            rec.output_len <= rec.max_tokens,
            "request {}: output beyond max_tokens: {:?}",
            id,
            rec
        );
        prop_assert_eq!(rec.max_tokens, req.max_tokens);
        prop_assert_eq!(rec.prompt_len, req.prompt_len);
        prop_assert_eq!(rec.arrival_ns, req.arrival);
        if self.should_reject(req) {
            prop_assert!(
                rec.finish_reason.is_rejection(),
                "request {} should be rejected: {:?}",
                id,
                rec
            );
            prop_assert_eq!(rec.output_len, 0);
            prop_assert!(rec.first_scheduled_ns.is_none() && rec.first_token_ns.is_none());
        } else {
            prop_assert_eq!(
                rec.finish_reason,
                FinishReason::Length,
                "request {}: {:?}",
                id,
                rec
            );
            prop_assert_eq!(rec.output_len, rec.max_tokens, "request {}: {:?}", id, rec);
            prop_assert_eq!(
                rec.generated_tokens,
                req.n * rec.max_tokens,
                "request {}: every one of its {} sequences runs to max_tokens",
                id,
                req.n
            );
            let (Some(sched), Some(first)) = (rec.first_scheduled_ns, rec.first_token_ns) else {
                return Err(fail(format!(
                    "request {id} finished without times: {rec:?}"
                )));
            };
            prop_assert!(
                rec.arrival_ns <= sched && sched <= first && first <= rec.finish_ns,
                "request {}: times out of order: {:?}",
                id,
                rec
            );
        }
        let counted = self.preempted.get(&id).copied().unwrap_or(0);
        prop_assert_eq!(rec.num_preemptions, counted, "request {}: preemptions", id);
        self.run.records.push(rec);
        Ok(())
    }

    /// Invariants 1 and 2, and: block tables are held exactly by the running sequences
    /// (recompute preemption frees everything), each covering its computed tokens (4).
    fn check_pool(&self) -> Result<(), TestCaseError> {
        self.bm.check_invariants().map_err(fail)?;
        prop_assert!(self.bm.num_used() <= self.bm.num_blocks());
        prop_assert_eq!(
            self.bm.num_tables(),
            self.sched.num_running(),
            "tables held by non-running sequences (running {:?})",
            self.sched.running()
        );
        let bs = self.bm.block_size();
        for &id in self.sched.running() {
            let Some(s) = self.sched.sequence(id) else {
                return Err(fail(format!("running sequence {id} is not live")));
            };
            let table = self.bm.table(id);
            prop_assert!(!table.is_empty(), "running sequence {} holds no blocks", id);
            prop_assert!(
                table.len() as u64 * u64::from(bs) >= u64::from(s.num_computed),
                "seq {}: table of {} blocks x {} does not cover {} computed tokens",
                id,
                table.len(),
                bs,
                s.num_computed
            );
            prop_assert_eq!(s.status, SeqStatus::Running);
            prop_assert_eq!(s.num_tokens, s.request.prompt_len + s.output_len);
            prop_assert!(s.num_computed <= s.num_tokens);
            prop_assert!(
                s.output_len < s.request.max_tokens,
                "seq {} should have finished",
                id
            );
            if self.cfg.keep_tokens {
                prop_assert_eq!(s.output_tokens.len() as u32, s.output_len);
            }
        }
        prop_assert_eq!(self.sched.fcfs_violations(), 0, "FCFS violated");
        Ok(())
    }

    /// Invariants after planning a step: 1, 2, 4 (tables cover the step's work), 5.
    fn check_after_apply(&mut self, plan: &StepPlan) -> Result<(), TestCaseError> {
        self.check_pool()?;
        prop_assert!(
            plan.num_batched_tokens() <= self.cfg.max_num_batched_tokens,
            "step {}: {} tokens > budget {}",
            plan.step,
            plan.num_batched_tokens(),
            self.cfg.max_num_batched_tokens
        );
        prop_assert!(
            self.sched.num_running() <= self.cfg.max_num_seqs as usize,
            "step {}: {} running > max_num_seqs {}",
            plan.step,
            self.sched.num_running(),
            self.cfg.max_num_seqs
        );
        let bs = u64::from(self.bm.block_size());
        let mut seen = BTreeSet::new();
        for w in &plan.work {
            prop_assert!(
                seen.insert(w.seq),
                "step {}: seq {} twice",
                plan.step,
                w.seq
            );
            prop_assert!(w.len >= 1, "step {}: empty work {:?}", plan.step, w);
            prop_assert!(
                self.sched.running().contains(&w.seq),
                "step {}: {} not running",
                plan.step,
                w.seq
            );
            let Some(s) = self.sched.sequence(w.seq) else {
                return Err(fail(format!("step {}: seq {} not live", plan.step, w.seq)));
            };
            prop_assert_eq!(w.start, s.num_computed);
            if w.kind == WorkKind::Verify {
                // The last token and k drafts past it, within the request and the model.
                let k = w.drafts.as_ref().map_or(0, |d| d.k);
                prop_assert!(w.sample && w.start + 1 == s.num_tokens && w.len == 1 + k);
                prop_assert!(s.output_len + k < s.request.max_tokens);
                prop_assert!(s.num_tokens + k <= self.cfg.max_model_len);
            } else {
                prop_assert_eq!(
                    w.sample,
                    w.start + w.len == s.num_tokens,
                    "step {}: {:?}",
                    plan.step,
                    w
                );
                prop_assert!(w.start + w.len <= s.num_tokens);
            }
            if w.kind == WorkKind::Decode {
                prop_assert_eq!(w.len, 1);
            }
            let table = self.bm.table(w.seq);
            prop_assert!(
                table.len() as u64 * bs >= u64::from(w.context_len()),
                "step {}: seq {} table of {} blocks x {} does not cover [{}, {})",
                plan.step,
                w.seq,
                table.len(),
                bs,
                w.start,
                w.context_len()
            );
            if self.cfg.want_block_tables {
                prop_assert_eq!(&w.block_table[..], table);
            }
            // Sliding window: every block the step attends to is live; only blocks wholly
            // before the window are freed.
            let first = match self.cfg.sliding_window {
                Some(win) => ((w.start + 1).saturating_sub(win) / self.bm.block_size()) as usize,
                None => 0,
            };
            let needed = w.context_len().div_ceil(self.bm.block_size()) as usize;
            for (i, &b) in table.iter().enumerate().take(needed).skip(first) {
                prop_assert!(
                    b != NULL_BLOCK,
                    "step {}: seq {} block {} in the window was freed",
                    plan.step,
                    w.seq,
                    i
                );
            }
            if self.cfg.sliding_window.is_none() {
                prop_assert!(!table.contains(&NULL_BLOCK));
            }
            if self.bm.is_contiguous() && !self.forked.contains(&request_of(w.seq)) {
                prop_assert!(
                    table.windows(2).all(|p| p[1] == p[0] + 1),
                    "step {}: seq {} table {:?} is not one run",
                    plan.step,
                    w.seq,
                    table
                );
            }
        }
        for &p in &plan.preempted {
            *self.preempted.entry(request_of(p)).or_default() += 1;
            self.run.preemptions += 1;
            prop_assert!(
                !seen.contains(&p),
                "step {}: preempted {} also runs",
                plan.step,
                p
            );
            prop_assert!(
                self.bm.table(p).is_empty(),
                "preempted {} still holds blocks",
                p
            );
            let Some(s) = self.sched.sequence(p) else {
                return Err(fail(format!("preempted seq {p} is not live")));
            };
            prop_assert_eq!(s.status, SeqStatus::Preempted);
            if self.bm.is_swapped(p) {
                // Swapped: its computed tokens stay, in CPU blocks that cover them.
                prop_assert!(s.swapped, "seq {} swapped but not marked", p);
                self.run.swaps += 1;
            } else {
                prop_assert!(!s.swapped);
                prop_assert_eq!(s.num_computed, 0);
            }
        }
        // Swap lists: no CPU block is written twice or written and read in one step (the
        // swap-outs run first), and every swapped-in block lands in a running table.
        let out: BTreeSet<u32> = plan.swap_out.iter().map(|&(_, c)| c).collect();
        prop_assert_eq!(out.len(), plan.swap_out.len(), "a CPU block written twice");
        for &(c, _) in &plan.swap_in {
            prop_assert!(
                !out.contains(&c),
                "CPU block {} overwritten before its swap-in",
                c
            );
        }
        for &(_, g) in &plan.swap_in {
            prop_assert!(
                self.sched
                    .running()
                    .iter()
                    .any(|&r| self.bm.table(r).contains(&g)),
                "step {}: swapped-in block {} is in no running table",
                plan.step,
                g
            );
        }
        if !self.bm.swaps() {
            prop_assert!(plan.swap_out.is_empty() && plan.swap_in.is_empty());
        }
        // Copy-on-write: each copy lands in a distinct block of a running sequence that is
        // not also a swap-in target, and comes from a block still held by another table.
        let dsts: BTreeSet<u32> = plan.block_copies.iter().map(|&(_, d)| d).collect();
        prop_assert_eq!(
            dsts.len(),
            plan.block_copies.len(),
            "a block copied into twice"
        );
        for &(src, dst) in &plan.block_copies {
            prop_assert!(src != dst);
            prop_assert!(!plan.swap_in.iter().any(|&(_, g)| g == dst));
            let holders = |b: u32| {
                self.sched
                    .running()
                    .iter()
                    .filter(|&&r| {
                        self.bm.table(r).contains(&b)
                            || self.bm.side_tables(r).iter().any(|t| t.contains(&b))
                    })
                    .count()
            };
            prop_assert_eq!(holders(dst), 1, "copy target {} not private", dst);
            // A source freed in this step (its other holders preempted) is not reused by
            // the step before the copy reads it.
            prop_assert!(
                !dsts.contains(&src),
                "copy source {} overwritten by a copy",
                src
            );
            prop_assert!(
                !plan.swap_in.iter().any(|&(_, g)| g == src),
                "copy source {} overwritten by a swap-in",
                src
            );
            let fresh = plan
                .work
                .iter()
                .any(|w| w.start == 0 && w.block_table.contains(&src));
            prop_assert!(!fresh, "copy source {} handed to a new prefill", src);
        }
        Ok(())
    }

    fn check_after_commit(&self) -> Result<(), TestCaseError> {
        self.check_pool()
    }

    /// Before a commit, each verify work's `(seq, k, accepted, output_len, table length
    /// before the step)`, checking accepted <= drafted.
    fn verify_state(
        &self,
        plan: &StepPlan,
        outcome: &StepOutcome,
    ) -> Result<Vec<VerifyBefore>, TestCaseError> {
        let verify: Vec<_> = plan
            .work
            .iter()
            .filter(|w| w.kind == WorkKind::Verify)
            .collect();
        prop_assert_eq!(verify.len(), outcome.accepted.len());
        let mut out = Vec::new();
        for (w, &a) in verify.iter().zip(&outcome.accepted) {
            let k = w.drafts.as_ref().map_or(0, |d| d.k);
            prop_assert!(k >= 1 && w.len == 1 + k, "verify work {:?}", w);
            prop_assert!(a <= k, "accepted {} of {} drafts", a, k);
            let Some(s) = self.sched.sequence(w.seq) else {
                return Err(fail(format!("verify of dead seq {}", w.seq)));
            };
            let before = self.tables_before.get(&w.seq).copied().unwrap_or(0);
            out.push((w.seq, k, a, s.output_len, before));
        }
        Ok(out)
    }

    /// After a commit: a verify step emitted its accepted drafts plus one token (unless
    /// the request ended), and its sequence holds the blocks it held before the step plus
    /// those of the tokens it verified, no lookahead block more.
    fn check_verify(&self, before: &[VerifyBefore]) -> Result<(), TestCaseError> {
        let bs = self.bm.block_size();
        for &(seq, _k, a, out_before, table_before) in before {
            let Some(s) = self.sched.sequence(seq) else {
                // Finished at max_tokens.
                continue;
            };
            prop_assert_eq!(
                s.output_len,
                out_before + a + 1,
                "seq {}: accepted {} drafts",
                seq,
                a
            );
            prop_assert_eq!(s.num_computed + 1, s.num_tokens);
            let table = self.bm.table(seq).len();
            let want = table_before.max(s.num_computed.div_ceil(bs) as usize);
            prop_assert_eq!(
                table,
                want,
                "seq {}: {} blocks after a verify that accepted {} (held {} before, {} tokens computed)",
                seq,
                table,
                a,
                table_before,
                s.num_computed
            );
        }
        Ok(())
    }

    /// Invariants 6 (everybody ended once), 7 (no leak) and 8 (FCFS without preemption).
    fn check_end(&self) -> Result<(), TestCaseError> {
        prop_assert_eq!(
            self.ended.len(),
            self.requests.len(),
            "not every request ended"
        );
        prop_assert!(!self.sched.has_work());
        prop_assert_eq!(self.sched.num_live(), 0);
        self.bm.check_invariants().map_err(fail)?;
        prop_assert_eq!(self.bm.num_used(), 0, "blocks leaked");
        prop_assert_eq!(self.bm.num_tables(), 0, "tables leaked");
        prop_assert_eq!(self.bm.num_swapped_blocks(), 0, "CPU blocks leaked");
        prop_assert_eq!(self.sched.fcfs_violations(), 0);
        if self.run.preemptions == 0 && self.cfg.queue == QueuePolicy::Fcfs {
            let mut admitted: Vec<&RequestRecord> = self
                .run
                .records
                .iter()
                .filter(|r| !r.finish_reason.is_rejection())
                .collect();
            admitted.sort_by_key(|r| (r.arrival_ns, r.request_id));
            for pair in admitted.windows(2) {
                prop_assert!(
                    pair[0].first_scheduled_ns <= pair[1].first_scheduled_ns,
                    "FCFS: request {} (arrived {}) first scheduled at {:?}, after request {} (arrived {}) at {:?}",
                    pair[0].request_id,
                    pair[0].arrival_ns,
                    pair[0].first_scheduled_ns,
                    pair[1].request_id,
                    pair[1].arrival_ns,
                    pair[1].first_scheduled_ns
                );
            }
        }
        Ok(())
    }
}

/// Runs one case through the harness.
fn simulate(
    knobs: &Knobs,
    kind: SchedulerKind,
    requests: &[Request],
) -> Result<Run, TestCaseError> {
    Harness::new(knobs, kind, requests)?.simulate()
}

// ---------------------------------------------------------------------------------------
// Per-kind properties of a trace
// ---------------------------------------------------------------------------------------

/// Static batching: never preempts, never admits while a batch runs.
fn check_static_trace(run: &Run) -> Result<(), TestCaseError> {
    // Reservations are per table: only forked children (n > 1) can run out of blocks.
    let forked = run
        .records
        .iter()
        .any(|r| r.generated_tokens > r.output_len);
    if !forked {
        prop_assert_eq!(run.preemptions, 0, "static batching preempted");
    }
    // A padded batch (half the static runs) keeps a pad row for each finished member:
    // rows computed >= the most the batch ever ran at once, every pad row at the step's
    // longest context.
    let mut members = 0usize;
    for s in &run.steps {
        if s.running_before.is_empty() {
            members = 0;
        }
        members = members.max(s.plan.work.len());
        let pad = &s.plan.padding;
        prop_assert!(pad.prefill.iter().all(|&(_, n)| n > 0));
        if !pad.decode.is_empty() && !forked {
            prop_assert!(
                s.plan.num_prefill_tokens() == 0,
                "pad rows in a prefill step"
            );
            prop_assert!(s.plan.work.len() + pad.decode.len() >= members);
            let longest = s
                .plan
                .work
                .iter()
                .map(|w| w.context_len())
                .max()
                .unwrap_or(0);
            prop_assert!(pad.decode.iter().all(|&c| c >= longest));
        }
        // Every decode row of a padded batch attends at the padded context; a step without
        // decodes has none.
        let decoding = s.plan.work.iter().filter(|w| w.kind != WorkKind::Prefill);
        match decoding.map(|w| w.context_len()).max() {
            None => prop_assert_eq!(pad.context, 0, "a padded context without decodes"),
            Some(longest) if run.padded => {
                prop_assert!(pad.context >= longest);
                prop_assert!(pad.decode.iter().all(|&c| c == pad.context));
            }
            Some(_) => prop_assert_eq!(pad.context, 0, "a padded context unpadded"),
        }
        prop_assert!(forked || s.plan.preempted.is_empty());
        let admitted = s.admitted();
        prop_assert!(
            admitted.is_empty() || s.running_before.is_empty(),
            "step {}: static admitted {:?} while batch {:?} runs",
            s.plan.step,
            admitted,
            s.running_before
        );
    }
    Ok(())
}

/// Continuous batching (prefill first): a step either admits new sequences and runs only
/// them, each to its last token (whole prompts; a re-admission whose prefix hit leaves one
/// token is labelled a decode), or runs decodes only (of running sequences and of swapped
/// ones coming back).
fn check_continuous_trace(run: &Run) -> Result<(), TestCaseError> {
    for s in &run.steps {
        let admitted = s.admitted();
        let prefill_step = s
            .plan
            .work
            .iter()
            .all(|w| w.sample && admitted.contains(&w.seq));
        let decode_step = s.plan.work.iter().all(|w| w.kind != WorkKind::Prefill);
        prop_assert!(
            prefill_step || decode_step,
            "step {}: mixed continuous step (admitted {:?}) {:?}",
            s.plan.step,
            admitted,
            s.plan.work
        );
    }
    Ok(())
}

/// Chunked prefill: within budget; without chunking, every prefill is a whole prompt (it
/// samples in the step that starts it); with it, a partial prefill chunk means the budget was used up
/// (in steps without preemption or a sequence waiting for a step in flight), up to the tokens prefix-cache hits of newly admitted
/// sequences saved (the budget is planned before the block manager's lookup).
fn check_chunked_trace(run: &Run) -> Result<(), TestCaseError> {
    for s in &run.steps {
        let tokens = s.plan.num_batched_tokens();
        prop_assert!(tokens <= s.budget);
        let partial = s.plan.work.iter().any(|w| !w.sample);
        if let Some(limit) = s.prefill_limit {
            // Every new prompt after the step's first prefill fitted what was left (of the
            // tokens planned before drafts join their verify steps).
            let drafted: u32 = s
                .plan
                .work
                .iter()
                .filter_map(|w| w.drafts.as_ref().map(|d| d.k))
                .sum();
            prop_assert!(
                s.admitted().len() < 2 || tokens - drafted < limit,
                "step {}: {} new prompts in {tokens} tokens past max_prefill_tokens {limit}: {:?}",
                s.plan.step,
                s.admitted().len(),
                s.plan.work
            );
        }
        if s.whole {
            prop_assert!(
                !partial,
                "step {}: a prompt split without chunked prefill: {:?}",
                s.plan.step,
                s.plan.work
            );
        }
        let admitted = s.admitted();
        let hit: u32 = s
            .plan
            .work
            .iter()
            .filter(|w| admitted.contains(&w.seq))
            .map(|w| w.start)
            .sum();
        if partial && s.plan.preempted.is_empty() && !s.deferred {
            prop_assert!(
                tokens <= s.budget && tokens + hit >= s.budget,
                "step {}: partial chunk but budget {} not used up: {:?}",
                s.plan.step,
                s.budget,
                s.plan.work
            );
        }
    }
    Ok(())
}

fn check_kind_trace(kind: SchedulerKind, run: &Run) -> Result<(), TestCaseError> {
    match kind {
        SchedulerKind::Static => check_static_trace(run),
        SchedulerKind::Continuous => check_continuous_trace(run),
        SchedulerKind::Chunked => check_chunked_trace(run),
    }
}

/// Runs a case twice for `kind`: checks every invariant and that both runs are identical.
fn check_case(
    knobs: &Knobs,
    kind: SchedulerKind,
    requests: &[Request],
) -> Result<Run, TestCaseError> {
    let first = simulate(knobs, kind, requests)?;
    let second = simulate(knobs, kind, requests)?;
    prop_assert!(
        first.records == second.records,
        "{}: records differ between runs",
        kind.as_str()
    );
    prop_assert!(
        first.steps == second.steps,
        "{}: steps differ between runs",
        kind.as_str()
    );
    check_kind_trace(kind, &first)?;
    Ok(first)
}

// ---------------------------------------------------------------------------------------
// Real driver: inline vs actors
// ---------------------------------------------------------------------------------------

/// A writer whose bytes remain readable after the collector dropped it.
#[derive(Clone, Default)]
struct SharedBuf(Rc<RefCell<Vec<u8>>>);

impl Write for SharedBuf {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl SharedBuf {
    fn bytes(&self) -> Vec<u8> {
        self.0.borrow().clone()
    }
}

/// SmolLM2-135M in bf16 on one H100 SXM.
fn deployment() -> Deployment {
    Deployment {
        parallel: Default::default(),
        model: find_model("smollm2-135m")
            .expect("catalog has smollm2-135m")
            .clone(),
        gpu: find_gpu("h100-sxm").expect("catalog has h100-sxm").clone(),
        tp: 1,
        pp: 1,
        dtype: Dtype::Bf16,
        kv_dtype: Dtype::Bf16,
    }
}

/// Runs the real driver; returns the bytes of requests.csv and steps.csv.
fn drive(
    driver: DriverKind,
    knobs: &Knobs,
    kind: SchedulerKind,
    requests: &[Request],
    backend: Box<dyn Backend>,
) -> Result<(Vec<u8>, Vec<u8>), TestCaseError> {
    let scheduler = Scheduler::new(knobs.config(kind)).map_err(fail)?;
    let block_manager = block_manager(knobs);
    let (req_csv, step_csv) = (SharedBuf::default(), SharedBuf::default());
    let mut sink = csv_collector(&req_csv, &step_csv);
    let mut workload = requests.iter().cloned().map(Ok::<Request, WorkloadError>);
    let stats = run_to_end(
        driver,
        sim::driver::EngineParts {
            scheduler,
            block_manager,
            backend,
        },
        &mut workload,
        sim::driver::Client::default(),
        &mut sink,
        &mut |_| {},
    )
    .map_err(fail)?;
    prop_assert_eq!(stats.arrived, requests.len() as u64);
    prop_assert_eq!(stats.ended, requests.len() as u64);
    prop_assert_eq!(stats.blocks_in_use_at_end, 0);
    sink.finish(RunInfo::default()).map_err(fail)?;
    Ok((req_csv.bytes(), step_csv.bytes()))
}

/// A collector writing both CSVs into shared buffers.
fn csv_collector(requests: &SharedBuf, steps: &SharedBuf) -> RunCollector {
    RunCollector::new(Default::default(), vec!["c".into()])
        .with_csv(Box::new(requests.clone()), Box::new(steps.clone()))
}

/// The CSV bytes of a harness run, written through the same collector.
fn harness_csv(run: &Run) -> Result<(Vec<u8>, Vec<u8>), TestCaseError> {
    let (req_csv, step_csv) = (SharedBuf::default(), SharedBuf::default());
    let mut sink = csv_collector(&req_csv, &step_csv);
    for r in &run.records {
        sink.record_request(r).map_err(fail)?;
    }
    for s in &run.step_records {
        sink.record_step(s).map_err(fail)?;
    }
    sink.finish(RunInfo::default()).map_err(fail)?;
    Ok((req_csv.bytes(), step_csv.bytes()))
}

/// The cost model backend of the driver tests.
fn cost_model_backend() -> Box<dyn Backend> {
    Box::new(CostModelBackend::new(CostModel::new(
        deployment(),
        CostParams::default(),
    )))
}

/// Asserts two CSV outputs are byte-identical, showing both when not.
fn assert_same_csv(what: &str, a: &[u8], b: &[u8]) -> Result<(), TestCaseError> {
    prop_assert!(
        a == b,
        "{} differs:\n{}\n---\n{}",
        what,
        String::from_utf8_lossy(a),
        String::from_utf8_lossy(b)
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(1024))]

    /// Invariants 1, 2, 4, 5, 6, 7, 8, 9 and 11 for every scheduler kind on random workloads,
    /// block sizes, pools (down to one max-length sequence), seat and token limits.
    #[test]
    fn invariants_hold_for_every_scheduler((knobs, requests) in case(24)) {
        for kind in SchedulerKind::ALL {
            check_case(&knobs, kind, &requests)?;
        }
    }
}

proptest! {
    #![proptest_config(config(192))]

    /// Speculative decoding under every scheduler and every knob (prefix caching, swap,
    /// windows, the contiguous allocator, parallel sampling): every invariant holds,
    /// accepted <= drafted, a verify step emits its accepted drafts plus one token,
    /// rejected drafts leave no lookahead block behind (checked after each commit), no
    /// block leaks, and a second run repeats the first exactly.
    #[test]
    fn speculative_decoding_keeps_every_invariant(
        (knobs, requests) in case(12),
        k in 1u32..=5,
        mut rates in prop::collection::vec(0.0f64..=1.0, 1..=5),
        zero_at in prop_oneof![Just(None), (2u32..=8).prop_map(Some)],
    ) {
        rates.sort_by(|a, b| b.total_cmp(a));
        let knobs = Knobs { spec: Some((k, rates, zero_at)), ..knobs };
        // (182 of 192 generated cases verify drafts; the others have one-token outputs or
        // budgets spent on prefills.)
        for kind in SchedulerKind::ALL {
            let run = check_case(&knobs, kind, &requests)?;
            check_kind_trace(kind, &run)?;
        }
    }

    /// Static batching on tight pools (one to three max-length sequences): it never
    /// preempts and nobody joins a running batch.
    #[test]
    fn static_never_preempts_nor_admits_mid_batch(
        (knobs, requests) in case(16),
        extra in 0u32..=2,
    ) {
        let knobs = Knobs {
            num_blocks: knobs.max_model_len.div_ceil(knobs.block_size) * (1 + extra)
                + knobs.side_pages,
            ..knobs
        };
        // Static batching reserves per table: children forked by n > 1 may still preempt.
        let run = check_case(&knobs, SchedulerKind::Static, &single(&requests))?;
        check_static_trace(&run)?;
    }

    /// Chunked prefill with a long decode running while long prompts arrive: steps mix the
    /// decode with prefill chunks, and never exceed the budget.
    #[test]
    fn chunked_mixes_decodes_and_chunks_within_budget(
        budget in 8u32..=64,
        seats in 2u32..=8,
        bs_exp in 0u32..=5,
        first_prompt_frac in 1u32..=100,
        later in prop::collection::vec((0u64..=8_000, 1u32..=100, 1u32..=100), 1..=5),
    ) {
        let max_model_len = 4 * budget;
        // Request 0: short prompt, 2 x budget output tokens (decodes for >= 16 us).
        let mut spec = vec![(0, 1 + first_prompt_frac * (budget / 2 - 1) / 100, 2 * budget)];
        // Later requests: prompts longer than the budget, so they are chunked; the first
        // arrives while request 0 decodes.
        for (i, &(gap, p, o)) in later.iter().enumerate() {
            let gap = if i == 0 { 2_000 + gap } else { gap };
            spec.push((gap, budget + 1 + p * (budget - 1) / 100, 1 + o * (budget - 1) / 100));
        }
        let requests = requests_from(&spec);
        let block_size = 1 << bs_exp;
        // Every request's own blocks (rounded up per sequence) fit at once.
        let blocks: u32 = requests
            .iter()
            .map(|r| (r.prompt_len + r.max_tokens).div_ceil(block_size))
            .sum();
        let knobs = Knobs::plain(block_size, blocks.max(max_model_len.div_ceil(block_size)) + 1, max_model_len, seats.min(budget), budget);
        let run = check_case(&knobs, SchedulerKind::Chunked, &requests)?;
        prop_assert_eq!(run.preemptions, 0, "pool holds every request: no preemption expected");
        let mixed = run.steps.iter().any(|s| {
            let decodes = s.plan.work.iter().any(|w| w.kind == WorkKind::Decode);
            let chunk = s.plan.work.iter().any(|w| w.kind == WorkKind::Prefill && !w.sample);
            decodes && chunk
        });
        prop_assert!(mixed, "no step mixed a decode with a prefill chunk");
    }

    /// A pool of exactly one max-length sequence, two requests of half a prompt each arriving
    /// together, then more: continuous and chunked must preempt (the first decode needs a
    /// block while the pool is full); static must not; all drain, nothing leaks.
    #[test]
    fn tiny_pool_forces_preemption_and_still_drains(
        bs_exp in 0u32..=5,
        k in 1u32..=3,
        seats in 2u32..=8,
        extra_budget in 0u32..=64,
        more in prop::collection::vec((gap(), 0u32..=100, 0u32..=100), 0..=4),
        prefix in any::<bool>(),
        swap in any::<bool>(),
    ) {
        let block_size = 1u32 << bs_exp;
        let max_model_len = 4 * block_size * k;
        let half = max_model_len / 2;
        let mut spec = vec![(0, half, half), (0, half, half)];
        for &(g, p, o) in &more {
            spec.push((g, 1 + p * (half - 1) / 100, 1 + o * (half - 1) / 100));
        }
        let requests = requests_from(&spec);
        let knobs = Knobs {
            want_tables: true,
            prefix,
            // Room for one whole max-length sequence.
            swap_blocks: swap.then_some(max_model_len / block_size),
            ..Knobs::plain(
                block_size,
                max_model_len / block_size,
                max_model_len,
                seats,
                max_model_len.max(seats) + extra_budget,
            )
        };
        for kind in SchedulerKind::ALL {
            let run = check_case(&knobs, kind, &requests)?;
            if kind == SchedulerKind::Static {
                prop_assert_eq!(run.preemptions, 0);
            } else {
                prop_assert!(run.preemptions > 0, "{}: no preemption on a full pool", kind.as_str());
                if swap {
                    // The CPU pool holds one max-length sequence: the first victim always
                    // swaps (later ones may find the pool taken and recompute).
                    prop_assert!(run.swaps >= 1, "{}: no preemption swapped", kind.as_str());
                } else {
                    prop_assert_eq!(run.swaps, 0);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(config(64))]

    /// The harness follows the real driver: `run_to_end` with the inline engine and the
    /// same fake backend writes the very CSVs the harness' records give.
    #[test]
    fn harness_matches_inline_driver((knobs, requests) in case(14)) {
        for kind in SchedulerKind::ALL {
            let run = simulate(&knobs, kind, &requests)?;
            let ours = harness_csv(&run)?;
            let driver = drive(DriverKind::Inline, &knobs, kind, &requests, Box::new(FakeBackend))?;
            assert_same_csv("requests.csv", &ours.0, &driver.0)?;
            assert_same_csv("steps.csv", &ours.1, &driver.1)?;
        }
    }
}

proptest! {
    #![proptest_config(config(8))]

    /// Invariant 11 across drivers: the inline and the actor driver write byte-identical
    /// requests.csv and steps.csv over the cost model.
    #[test]
    fn inline_and_actor_drivers_write_identical_csv(
        kind in prop::sample::select(SchedulerKind::ALL.to_vec()),
        spec in prop::collection::vec((0u64..=2_000_000, 1u32..=256, 1u32..=64), 1..=10),
        tie_every in 1usize..=3,
        num_blocks in 32u32..=96,
        max_num_seqs in 1u32..=8,
        budget in 8u32..=1024,
    ) {
        // Every `tie_every`-th request arrives with the previous one.
        let spec: Vec<(Nanos, u32, u32)> = spec
            .iter()
            .enumerate()
            .map(|(i, &(g, p, o))| (if i % tie_every == 0 { 0 } else { g }, p, o))
            .collect();
        let requests = requests_from(&spec);
        let knobs = Knobs::plain(16, num_blocks, 512, max_num_seqs, budget);
        let inline = drive(DriverKind::Inline, &knobs, kind, &requests, cost_model_backend())?;
        let actors = drive(DriverKind::Actors, &knobs, kind, &requests, cost_model_backend())?;
        let rows = inline.0.iter().filter(|&&b| b == b'\n').count();
        prop_assert_eq!(rows, requests.len() + 1, "one requests.csv row per request plus header");
        assert_same_csv("requests.csv", &inline.0, &actors.0)?;
        assert_same_csv("steps.csv", &inline.1, &actors.1)?;
    }
}
