//! The discrete-event driver: one clock, one event in flight.
//!
//! The clock owns a min-heap of events keyed by `(time in integer nanoseconds, sequence
//! number)`, so ties resolve in insertion order and every run is deterministic. Arrivals are
//! pulled lazily from the workload (one pending arrival at a time, so memory follows the
//! live requests, not the trace), through the benchmark [`Client`], which may cap the
//! requests in flight (a closed loop, `max_in_flight`). Whenever the worker is idle and work exists, the clock
//! asks the scheduler for a step, hands the plan to the worker, and schedules `StepDone` at
//! `now + duration`.
//!
//! The loop is written once, against [`EngineHandle`]; two handles implement it:
//! [`ActorEngine`] sends one actix message per step to the scheduler, block-manager and
//! worker actors (the product path), and [`InlineEngine`] calls the same cores directly
//! (about ten times faster, for large sweeps). A test pins that both give identical records.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use actix::prelude::*;
use analysis::RunCollector;
use engine::actors::{
    Arrive, BlockManagerActor, CommitStep, Execute, PlanStep, PoolUsage, SchedulerActor,
    WorkerActor,
};
use engine::backend::Backend;
use engine::block_manager::BlockManager;
use engine::cores::Cores;
use engine::plan::{StepOutcome, StepPlan};
use engine::record::{RequestRecord, StepRecord};
use engine::request::{Nanos, Request};
use engine::scheduler::{CommitResult, Scheduler};
use engine::EngineError;

use crate::workload::WorkloadError;

/// Errors that stop a run.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The workload could not produce a request.
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    /// The engine failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The backend failed.
    #[error(transparent)]
    Backend(#[from] engine::backend::BackendError),
    /// Writing records failed.
    #[error(transparent)]
    Analysis(#[from] analysis::AnalysisError),
}

/// A planned step and the queue state after planning.
pub type Planned = engine::actors::PlannedStep;

/// The engine operations the clock needs, one call per event.
#[allow(async_fn_in_trait)]
pub trait EngineHandle {
    /// A request arrives; returns its record if rejected on arrival.
    async fn arrive(
        &mut self,
        req: Request,
        now: Nanos,
    ) -> Result<Option<RequestRecord>, DriverError>;
    /// Plans a step; `None` when there is no work.
    async fn plan(&mut self, now: Nanos) -> Result<Option<Planned>, DriverError>;
    /// Executes a plan on the backend.
    async fn execute(&mut self, plan: StepPlan) -> Result<(StepPlan, StepOutcome), DriverError>;
    /// Commits a finished step; returns finished records and inter-token gaps.
    async fn commit(
        &mut self,
        plan: StepPlan,
        outcome: StepOutcome,
        now: Nanos,
    ) -> Result<(CommitResult, Vec<Nanos>), DriverError>;
    /// `(blocks in use, pool blocks, prefix-cache evictions so far)`.
    async fn pool_usage(&mut self) -> Result<(u32, u32, u64), DriverError>;
    /// Speculative decoding's acceptance counters, by request class.
    async fn spec_stats(&mut self) -> Result<Vec<engine::spec::SpecStats>, DriverError>;
    /// Tokens per KV block.
    async fn block_size(&mut self) -> Result<u32, DriverError>;
}

/// Calls the cores directly.
pub struct InlineEngine {
    cores: Cores,
    backend: Box<dyn Backend>,
}

impl InlineEngine {
    /// Assembles an inline engine.
    pub fn new(
        scheduler: Scheduler,
        block_manager: BlockManager,
        backend: Box<dyn Backend>,
    ) -> Self {
        InlineEngine {
            cores: Cores::new(scheduler, block_manager),
            backend,
        }
    }
}

impl EngineHandle for InlineEngine {
    async fn arrive(
        &mut self,
        req: Request,
        now: Nanos,
    ) -> Result<Option<RequestRecord>, DriverError> {
        Ok(self.cores.scheduler.add_request(req, now))
    }

    async fn plan(&mut self, now: Nanos) -> Result<Option<Planned>, DriverError> {
        Ok(self.cores.plan(now))
    }

    async fn execute(&mut self, plan: StepPlan) -> Result<(StepPlan, StepOutcome), DriverError> {
        let outcome = self.backend.execute(&plan)?;
        Ok((plan, outcome))
    }

    async fn commit(
        &mut self,
        plan: StepPlan,
        outcome: StepOutcome,
        now: Nanos,
    ) -> Result<(CommitResult, Vec<Nanos>), DriverError> {
        let result = self.cores.commit(&plan, &outcome, now)?;
        let gaps = self.cores.scheduler.take_itl_gaps().collect();
        Ok((result, gaps))
    }

    async fn block_size(&mut self) -> Result<u32, DriverError> {
        Ok(self.cores.block_manager.block_size())
    }

    async fn pool_usage(&mut self) -> Result<(u32, u32, u64), DriverError> {
        Ok((
            self.cores.block_manager.num_used(),
            self.cores.block_manager.num_blocks(),
            self.cores.block_manager.evictions(),
        ))
    }

    async fn spec_stats(&mut self) -> Result<Vec<engine::spec::SpecStats>, DriverError> {
        Ok(self.cores.scheduler.spec_stats().to_vec())
    }
}

/// Talks to the actors, one message per step and actor.
pub struct ActorEngine {
    block_size: Option<u32>,
    scheduler: Addr<SchedulerActor>,
    block_manager: Addr<BlockManagerActor>,
    worker: Addr<WorkerActor>,
}

impl ActorEngine {
    /// Starts the three actors on the current actix arbiter.
    pub fn start(
        scheduler: Scheduler,
        block_manager: BlockManager,
        backend: Box<dyn Backend>,
    ) -> Self {
        let block_size = Some(block_manager.block_size());
        let block_manager = BlockManagerActor::new(block_manager).start();
        let scheduler = SchedulerActor::new(scheduler, block_manager.clone()).start();
        let worker = WorkerActor::new(backend).start();
        ActorEngine {
            block_size,
            scheduler,
            block_manager,
            worker,
        }
    }
}

fn mailbox(e: MailboxError) -> DriverError {
    DriverError::Engine(EngineError::Mailbox(e.to_string()))
}

impl EngineHandle for ActorEngine {
    async fn arrive(
        &mut self,
        req: Request,
        now: Nanos,
    ) -> Result<Option<RequestRecord>, DriverError> {
        self.scheduler.send(Arrive(req, now)).await.map_err(mailbox)
    }

    async fn plan(&mut self, now: Nanos) -> Result<Option<Planned>, DriverError> {
        Ok(self
            .scheduler
            .send(PlanStep(now))
            .await
            .map_err(mailbox)??)
    }

    async fn execute(&mut self, plan: StepPlan) -> Result<(StepPlan, StepOutcome), DriverError> {
        Ok(self.worker.send(Execute(plan)).await.map_err(mailbox)??)
    }

    async fn commit(
        &mut self,
        plan: StepPlan,
        outcome: StepOutcome,
        now: Nanos,
    ) -> Result<(CommitResult, Vec<Nanos>), DriverError> {
        Ok(self
            .scheduler
            .send(CommitStep { plan, outcome, now })
            .await
            .map_err(mailbox)??)
    }

    async fn pool_usage(&mut self) -> Result<(u32, u32, u64), DriverError> {
        self.block_manager.send(PoolUsage).await.map_err(mailbox)
    }

    async fn spec_stats(&mut self) -> Result<Vec<engine::spec::SpecStats>, DriverError> {
        self.scheduler
            .send(engine::actors::SpecCounters)
            .await
            .map_err(mailbox)
    }

    async fn block_size(&mut self) -> Result<u32, DriverError> {
        self.block_size
            .ok_or_else(|| DriverError::Engine(EngineError::Mailbox("block size unknown".into())))
    }
}

enum Event {
    Arrival(Request),
    StepDone(StepPlan, StepOutcome),
    /// Plan again at this instant (a step that only preempted).
    Wake,
}

struct Scheduled {
    time: Nanos,
    seq: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.time, self.seq) == (other.time, other.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.time, self.seq).cmp(&(other.time, other.seq))
    }
}

/// The event queue: a min-heap on `(time, sequence number)`.
#[derive(Default)]
struct Clock {
    heap: BinaryHeap<Reverse<Scheduled>>,
    next_seq: u64,
}

impl Clock {
    fn push(&mut self, time: Nanos, event: Event) {
        self.heap.push(Reverse(Scheduled {
            time,
            seq: self.next_seq,
            event,
        }));
        self.next_seq += 1;
    }

    fn pop(&mut self) -> Option<Scheduled> {
        self.heap.pop().map(|Reverse(s)| s)
    }

    fn peek_time(&self) -> Option<Nanos> {
        self.heap.peek().map(|Reverse(s)| s.time)
    }
}

/// Counters of a finished run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunStats {
    /// Requests that arrived.
    pub arrived: u64,
    /// Requests that ended (finished or rejected).
    pub ended: u64,
    /// Steps executed.
    pub steps: u64,
    /// Simulated time of the last event.
    pub end_time: Nanos,
    /// KV blocks still in use at the end (a leak if > 0).
    pub blocks_in_use_at_end: u32,
    /// Blocks in the pool.
    pub pool_blocks: u32,
    /// Prefix-cache evictions.
    pub evictions: u64,
    /// Speculative decoding's acceptance counters, by request class.
    pub spec: Vec<engine::spec::SpecStats>,
}

/// The benchmark client between the workload and the engine (vLLM's `bench serve`): with
/// `max_in_flight`, at most that many requests are sent and not yet ended; a request that
/// arrives with every slot taken is sent when one frees (`think_ns` after the request that
/// held it ended), and its arrival, which latencies count from, is then.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Client {
    /// Requests in flight at most (`None`: an open loop, every request sent on arrival).
    pub max_in_flight: Option<u32>,
    /// A slot's pause between a request ending and the next being sent.
    pub think_ns: Nanos,
    /// A closed loop's clients start one by one over this time (the `k`-th of `N` at
    /// `k x ramp / N`), so that their requests do not run in lockstep.
    pub ramp_ns: Nanos,
    /// The engine's front end (`cost.request_overhead_ms`): a request reaches the
    /// scheduler this long after it is sent; its arrival, which latencies count from,
    /// stays the send.
    pub frontend_ns: Nanos,
}

/// The client's slots: clients not started yet (the `k`-th of `cap` starts `k x ramp / cap`
/// in), and when the others free (a request's end plus the think time).
struct Slots {
    /// Clients, `None` for an open loop (no cap).
    cap: Option<u64>,
    started: u64,
    ramp_ns: Nanos,
    freed: BinaryHeap<Reverse<Nanos>>,
    think_ns: Nanos,
    frontend_ns: Nanos,
    /// Pulled from the workload, waiting for a slot.
    held: Option<Request>,
    /// An arrival is on the clock (one at a time, so the workload is read lazily).
    scheduled: bool,
    /// The workload has no more requests.
    exhausted: bool,
    last_arrival: Nanos,
}

impl Slots {
    fn new(client: Client) -> Self {
        Slots {
            cap: client.max_in_flight.map(u64::from),
            started: 0,
            ramp_ns: client.ramp_ns,
            freed: BinaryHeap::new(),
            think_ns: client.think_ns,
            frontend_ns: client.frontend_ns,
            held: None,
            scheduled: false,
            exhausted: false,
            last_arrival: 0,
        }
    }

    /// A request ended at `now`: its slot frees after the think time.
    fn release(&mut self, now: Nanos) {
        if self.cap.is_some() {
            self.freed.push(Reverse(now.saturating_add(self.think_ns)));
        }
    }

    /// The earliest slot: a client yet to start, or a freed one (`Some(0)` with no cap).
    fn take_slot(&mut self) -> Option<Nanos> {
        let Some(cap) = self.cap else {
            return Some(0);
        };
        let start = (self.started < cap).then(|| {
            (u128::from(self.started) * u128::from(self.ramp_ns) / u128::from(cap)) as Nanos
        });
        let freed = self.freed.peek().map(|r| r.0);
        match (start, freed) {
            (Some(s), Some(f)) if f < s => self.freed.pop().map(|r| r.0),
            (Some(s), _) => {
                self.started += 1;
                Some(s)
            }
            (None, Some(_)) => self.freed.pop().map(|r| r.0),
            (None, None) => None,
        }
    }

    /// Puts the next request on the clock when none is and a slot can take it: sent at its
    /// arrival, or when the slot frees, and never before `now`.
    fn send_next(
        &mut self,
        workload: &mut dyn Iterator<Item = Result<Request, WorkloadError>>,
        clock: &mut Clock,
        stats: &mut RunStats,
        now: Nanos,
    ) -> Result<(), DriverError> {
        if self.scheduled || (self.exhausted && self.held.is_none()) {
            return Ok(());
        }
        let mut req = match self.held.take() {
            Some(r) => r,
            None => match workload.next().transpose()? {
                Some(r) => r,
                None => {
                    self.exhausted = true;
                    return Ok(());
                }
            },
        };
        let Some(slot) = self.take_slot() else {
            self.held = Some(req);
            return Ok(());
        };
        // The workload yields in arrival order; guard anyway so time never runs back.
        // Never before `now` as the scheduler counts it: a send at `t` arrives at
        // `t + frontend`.
        let slot = if self.cap.is_some() {
            slot.max(now.saturating_sub(self.frontend_ns))
        } else {
            slot
        };
        let t = req.arrival.max(slot).max(self.last_arrival);
        self.last_arrival = t;
        req.arrival = t;
        stats.arrived += 1;
        self.scheduled = true;
        clock.push(t.saturating_add(self.frontend_ns), Event::Arrival(req));
        Ok(())
    }
}

/// Runs a workload through an engine until every request has ended, feeding records to
/// `sink`, with `client` sending the requests. `progress` is called with the number of
/// ended requests.
pub async fn run<E: EngineHandle>(
    engine: &mut E,
    workload: &mut dyn Iterator<Item = Result<Request, WorkloadError>>,
    client: Client,
    sink: &mut RunCollector,
    progress: &mut dyn FnMut(u64),
) -> Result<RunStats, DriverError> {
    let mut clock = Clock::default();
    let mut stats = RunStats::default();
    let mut busy = false;
    let mut slots = Slots::new(client);
    slots.send_next(workload, &mut clock, &mut stats, 0)?;
    let (_, pool_blocks, _) = engine.pool_usage().await?;
    let block_size = engine.block_size().await?;

    while let Some(ev) = clock.pop() {
        let now = ev.time;
        stats.end_time = now;
        match ev.event {
            Event::Arrival(req) => {
                slots.scheduled = false;
                if let Some(rejected) = engine.arrive(req, now).await? {
                    sink.record_request(&rejected)?;
                    stats.ended += 1;
                    progress(stats.ended);
                    slots.release(now);
                }
                slots.send_next(workload, &mut clock, &mut stats, now)?;
            }
            Event::Wake => {}
            Event::StepDone(plan, outcome) => {
                busy = false;
                let (result, gaps) = engine.commit(plan, outcome, now).await?;
                sink.record_itl(&gaps);
                for r in &result.finished {
                    sink.record_request(r)?;
                }
                if !result.finished.is_empty() {
                    stats.ended += result.finished.len() as u64;
                    progress(stats.ended);
                    for _ in &result.finished {
                        slots.release(now);
                    }
                    slots.send_next(workload, &mut clock, &mut stats, now)?;
                }
            }
        }
        // Every event at this instant is handled before the worker is given a step.
        if busy || clock.peek_time() == Some(now) {
            continue;
        }
        let Some(planned) = engine.plan(now).await? else {
            continue;
        };
        let p = &planned.plan;
        let transfers = p.has_transfers();
        if p.is_empty() && !transfers && !p.preempted.is_empty() {
            // Nothing runs, but the preemptions changed the pool (a contiguous allocator
            // that could not grow a sequence in place): record them and plan again now.
            let outcome = StepOutcome::default();
            sink.record_step(&step_record(&planned, &outcome, pool_blocks, block_size))?;
            clock.push(now, Event::Wake);
            continue;
        }
        if planned.plan.is_empty() && !transfers {
            if clock.peek_time().is_none() {
                return Err(EngineError::Stalled {
                    time_ns: now,
                    waiting: planned.num_waiting as usize,
                    running: planned.num_running as usize,
                }
                .into());
            }
            continue;
        }
        let record = step_record(&planned, &StepOutcome::default(), pool_blocks, block_size);
        let (plan, outcome) = engine.execute(planned.plan).await?;
        sink.record_step(&StepRecord {
            duration_ns: outcome.duration,
            mbu: outcome.mbu,
            mfu: outcome.mfu,
            ..record
        })?;
        stats.steps += 1;
        busy = true;
        let done = now.checked_add(outcome.duration.max(1)).ok_or_else(|| {
            DriverError::Backend(engine::backend::BackendError {
                backend: "clock".into(),
                message: format!(
                    "step {} of {} ns at t = {now} ns overflows the simulated clock",
                    plan.step, outcome.duration
                ),
            })
        })?;
        clock.push(done, Event::StepDone(plan, outcome));
    }
    let (used, pool, evictions) = engine.pool_usage().await?;
    stats.blocks_in_use_at_end = used;
    stats.pool_blocks = pool;
    stats.evictions = evictions;
    stats.spec = engine.spec_stats().await?;
    Ok(stats)
}

/// The `steps.csv` row of a planned step and its outcome.
pub fn step_record(
    planned: &Planned,
    outcome: &StepOutcome,
    pool_blocks: u32,
    block_size: u32,
) -> StepRecord {
    let plan = &planned.plan;
    let batched = plan.num_batched_tokens();
    let prefill_tokens = plan.num_prefill_tokens();
    StepRecord {
        step: plan.step,
        start_ns: plan.start,
        duration_ns: outcome.duration,
        num_seqs: plan.work.len() as u32,
        num_batched_tokens: batched,
        num_prefill_tokens: prefill_tokens,
        num_decode_tokens: batched - prefill_tokens,
        num_waiting: planned.num_waiting,
        num_running: planned.num_running,
        num_preempted: plan.preempted.len() as u32,
        kv_blocks_used: planned.blocks_used,
        kv_usage: f64::from(planned.blocks_used) / f64::from(pool_blocks.max(1)),
        mbu: outcome.mbu,
        mfu: outcome.mfu,
        kv_tokens: planned.stats.kv_tokens,
        kv_slots: u64::from(planned.blocks_used) * u64::from(block_size),
        num_swapped: planned.stats.num_swapped,
        swap_in_blocks: plan.swap_in.len() as u32,
        swap_out_blocks: plan.swap_out.len() as u32,
        block_copies: plan.block_copies.len() as u32,
        recomputed_tokens: planned.stats.recomputed_tokens,
        kv_external_fragmentation: planned.stats.external_fragmentation,
    }
}

/// Which driver runs a variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DriverKind {
    /// Scheduler, block-manager and worker actors (actix), one message per step.
    Actors,
    /// The same cores called directly (faster; identical results).
    Inline,
}

/// The engine's three cores, as a driver takes them.
pub struct EngineParts {
    /// The scheduler.
    pub scheduler: Scheduler,
    /// The KV block manager.
    pub block_manager: BlockManager,
    /// The backend that executes steps.
    pub backend: Box<dyn Backend>,
}

/// Runs to completion with the chosen driver.
pub fn run_to_end(
    kind: DriverKind,
    parts: EngineParts,
    workload: &mut dyn Iterator<Item = Result<Request, WorkloadError>>,
    client: Client,
    sink: &mut RunCollector,
    progress: &mut dyn FnMut(u64),
) -> Result<RunStats, DriverError> {
    let EngineParts {
        scheduler,
        block_manager,
        backend,
    } = parts;
    match kind {
        DriverKind::Inline => {
            let mut engine = InlineEngine::new(scheduler, block_manager, backend);
            futures_executor::block_on(run(&mut engine, workload, client, sink, progress))
        }
        DriverKind::Actors => {
            let system = actix::System::new();
            let result = system.block_on(async move {
                let mut engine = ActorEngine::start(scheduler, block_manager, backend);
                run(&mut engine, workload, client, sink, progress).await
            });
            result
        }
    }
}
