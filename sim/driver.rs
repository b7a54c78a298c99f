//! The discrete-event driver: one clock, one event in flight.
//!
//! The clock owns a min-heap of events keyed by `(time in integer nanoseconds, sequence
//! number)`, so ties resolve in insertion order and every run is deterministic. Arrivals are
//! pulled lazily from the workload (one pending arrival at a time, so memory follows the
//! live requests, not the trace), through the benchmark [`Client`], which may cap the
//! requests in flight (a closed loop, `max_in_flight`). Whenever the worker is idle and work exists, the clock
//! asks the scheduler for a step, hands the plan to the worker, and schedules `StepDone` at
//! `now + duration`. Under pipeline parallelism an engine keeps up to its
//! `max_concurrent_batches` micro-batches in flight: the next step is planned once the
//! first stage is free (the backend's `StepOutcome::interval`), and each ends no sooner
//! than a stage after the one ahead of it, so steps commit in order.
//!
//! Between the client and the engines stands the engine's front end: a delay per request
//! (`cost.request_overhead_ms`) and, when set, one serial process (`cost.frontend_request_ms`
//! per request, `cost.frontend_update_us` per sequence with output in a step) that serves
//! requests on their way in and steps' tokens on their way out first come first served. A
//! finished request's record then carries the times its client saw its first and last
//! token, and a closed loop's client sends its next request from the latter.
//!
//! A fleet (`[cluster]`) is the same loop over many engines on the one clock: each
//! arrival first goes to the router ([`RouterHandle`]), which names the replica; steps,
//! wakes and records carry the replica's index; the router's view of the replicas is
//! refreshed by a `Refresh` event every `refresh_ms`. The engines of one replica's
//! attention-DP ranks form a lockstep group: a step starts on all of them together, once the
//! last has ended, and ends when the longest does. One engine is a fleet of one without a
//! router, and runs exactly as before.
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
    Arrive, BlockManagerActor, CommitStep, Execute, PlanStep, PoolUsage, QueueState,
    SchedulerActor, WorkerActor,
};
use engine::backend::Backend;
use engine::block_manager::BlockManager;
use engine::cores::Cores;
use engine::plan::{StepOutcome, StepPlan};
use engine::record::{RequestRecord, StepRecord};
use engine::request::{Nanos, Request, SeqId};
use engine::scheduler::{CommitResult, Scheduler};
use engine::EngineError;

use crate::router::{Decision, Load, Router, RouterActor, RouterError};
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
    /// The router's bookkeeping broke.
    #[error(transparent)]
    Router(#[from] RouterError),
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
    /// What the replica exports to a router: its queues and KV usage.
    async fn load(&mut self) -> Result<Load, DriverError>;
    /// Frees the blocks of finished sequences whose KV was held (sent to a decode
    /// replica).
    async fn free_held(&mut self, ids: Vec<SeqId>) -> Result<(), DriverError>;
    /// The CPU offload tier's counters (`None`: no tier).
    async fn offload_stats(
        &mut self,
    ) -> Result<Option<engine::block_manager::offload::OffloadStats>, DriverError>;
    /// Ends a live request for `reason` at `now` (`sim serve`: a client hung up, or a stop
    /// string matched): its record when it left the queue at once, else it ends at its
    /// next step.
    async fn abort(
        &mut self,
        id: SeqId,
        reason: engine::request::FinishReason,
        now: Nanos,
    ) -> Result<Option<RequestRecord>, DriverError>;
    /// Ends choice `index` of live request `id` at its next step (`sim serve`: a stop
    /// string matched in that choice alone).
    async fn abort_choice(
        &mut self,
        id: SeqId,
        index: u32,
        reason: engine::request::FinishReason,
    ) -> Result<(), DriverError>;
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

    async fn free_held(&mut self, ids: Vec<SeqId>) -> Result<(), DriverError> {
        self.cores.block_manager.release(&[], &[], &[], &ids);
        Ok(())
    }

    async fn offload_stats(
        &mut self,
    ) -> Result<Option<engine::block_manager::offload::OffloadStats>, DriverError> {
        Ok(self.cores.block_manager.offload_stats())
    }

    async fn abort(
        &mut self,
        id: SeqId,
        reason: engine::request::FinishReason,
        now: Nanos,
    ) -> Result<Option<RequestRecord>, DriverError> {
        Ok(self.cores.scheduler.abort(id, reason, now))
    }

    async fn abort_choice(
        &mut self,
        id: SeqId,
        index: u32,
        reason: engine::request::FinishReason,
    ) -> Result<(), DriverError> {
        self.cores.scheduler.abort_choice(id, index, reason);
        Ok(())
    }

    async fn load(&mut self) -> Result<Load, DriverError> {
        let bm = &self.cores.block_manager;
        Ok(Load {
            waiting: self.cores.scheduler.num_waiting() as u32,
            running: self.cores.scheduler.num_running() as u32,
            kv_usage: f64::from(bm.num_used()) / f64::from(bm.num_blocks().max(1)),
        })
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

    async fn free_held(&mut self, ids: Vec<SeqId>) -> Result<(), DriverError> {
        self.block_manager
            .send(engine::actors::Release {
                cache: Vec::new(),
                rollback: Vec::new(),
                fork: Vec::new(),
                free: ids,
            })
            .await
            .map_err(mailbox)?;
        Ok(())
    }

    async fn offload_stats(
        &mut self,
    ) -> Result<Option<engine::block_manager::offload::OffloadStats>, DriverError> {
        self.block_manager
            .send(engine::actors::OffloadCounters)
            .await
            .map_err(mailbox)
    }

    async fn abort(
        &mut self,
        id: SeqId,
        reason: engine::request::FinishReason,
        now: Nanos,
    ) -> Result<Option<RequestRecord>, DriverError> {
        self.scheduler
            .send(engine::actors::Abort(id, reason, now))
            .await
            .map_err(mailbox)
    }

    async fn abort_choice(
        &mut self,
        id: SeqId,
        index: u32,
        reason: engine::request::FinishReason,
    ) -> Result<(), DriverError> {
        self.scheduler
            .send(engine::actors::AbortChoice(id, index, reason))
            .await
            .map_err(mailbox)
    }

    async fn load(&mut self) -> Result<Load, DriverError> {
        let (waiting, running) = self.scheduler.send(QueueState).await.map_err(mailbox)?;
        let (used, blocks, _) = self.block_manager.send(PoolUsage).await.map_err(mailbox)?;
        Ok(Load {
            waiting,
            running,
            kv_usage: f64::from(used) / f64::from(blocks.max(1)),
        })
    }
}

/// The router operations the clock needs (a fleet's; one engine has none).
#[allow(async_fn_in_trait)]
pub trait RouterHandle {
    /// Routes a request at a time; the request comes back with the decision.
    async fn route(&mut self, req: Request, now: Nanos)
        -> Result<(Request, Decision), DriverError>;
    /// These requests ended on `replica`.
    async fn ended(&mut self, ids: Vec<SeqId>, replica: usize) -> Result<(), DriverError>;
    /// A disaggregated request's prefill ended on `from`; its decode is on `to`.
    async fn handoff(&mut self, id: SeqId, from: usize, to: usize) -> Result<(), DriverError>;
    /// The replicas' exported loads at `now`; answers the requests in flight.
    async fn refresh(&mut self, loads: Vec<Load>, now: Nanos) -> Result<usize, DriverError>;
    /// How often loads are refreshed (0: before every decision).
    fn refresh_ns(&self) -> Nanos;
}

impl RouterHandle for Router {
    async fn route(
        &mut self,
        req: Request,
        now: Nanos,
    ) -> Result<(Request, Decision), DriverError> {
        let d = Router::route(self, &req, now)?;
        Ok((req, d))
    }

    async fn ended(&mut self, ids: Vec<SeqId>, replica: usize) -> Result<(), DriverError> {
        for id in ids {
            Router::ended(self, id, replica)?;
        }
        Ok(())
    }

    async fn handoff(&mut self, id: SeqId, from: usize, to: usize) -> Result<(), DriverError> {
        Ok(Router::handoff(self, id, from, to)?)
    }

    async fn refresh(&mut self, loads: Vec<Load>, now: Nanos) -> Result<usize, DriverError> {
        Router::refresh(self, &loads, now);
        Ok(self.in_flight())
    }

    fn refresh_ns(&self) -> Nanos {
        Router::refresh_ns(self)
    }
}

/// Talks to a [`RouterActor`].
pub struct ActorRouter {
    addr: Addr<RouterActor>,
    refresh_ns: Nanos,
}

impl ActorRouter {
    /// Starts the router's actor on the current arbiter.
    pub fn start(router: Router) -> Self {
        let refresh_ns = router.refresh_ns();
        ActorRouter {
            addr: RouterActor::new(router).start(),
            refresh_ns,
        }
    }
}

impl RouterHandle for ActorRouter {
    async fn route(
        &mut self,
        req: Request,
        now: Nanos,
    ) -> Result<(Request, Decision), DriverError> {
        Ok(self
            .addr
            .send(crate::router::Route(req, now))
            .await
            .map_err(mailbox)??)
    }

    async fn ended(&mut self, ids: Vec<SeqId>, replica: usize) -> Result<(), DriverError> {
        Ok(self
            .addr
            .send(crate::router::Ended(ids, replica))
            .await
            .map_err(mailbox)??)
    }

    async fn handoff(&mut self, id: SeqId, from: usize, to: usize) -> Result<(), DriverError> {
        Ok(self
            .addr
            .send(crate::router::Handoff(id, from, to))
            .await
            .map_err(mailbox)??)
    }

    async fn refresh(&mut self, loads: Vec<Load>, now: Nanos) -> Result<usize, DriverError> {
        self.addr
            .send(crate::router::Refresh(loads, now))
            .await
            .map_err(mailbox)
    }

    fn refresh_ns(&self) -> Nanos {
        self.refresh_ns
    }
}

/// Where a run's records go: one collector for one engine; a fleet's sink splits them by
/// replica and pool and writes the router's decisions.
pub trait Records {
    /// A request ended (finished or rejected) on `replica`.
    fn request(&mut self, replica: usize, r: &RequestRecord)
        -> Result<(), analysis::AnalysisError>;
    /// `replica` ran a step.
    fn step(&mut self, replica: usize, s: &StepRecord) -> Result<(), analysis::AnalysisError>;
    /// Inter-token gaps of a step of `replica`.
    fn itl(&mut self, replica: usize, gaps: &[Nanos]);
    /// The router decided.
    fn route(&mut self, _d: &Decision) -> Result<(), analysis::AnalysisError> {
        Ok(())
    }
    /// A disaggregated request's prefill ended on `replica` (its request ends later, on
    /// the decode replica).
    fn prefilled(
        &mut self,
        _replica: usize,
        _r: &RequestRecord,
    ) -> Result<(), analysis::AnalysisError> {
        Ok(())
    }
    /// A prompt's KV moved between replicas.
    fn transfer(&mut self, _t: &Transfer) -> Result<(), analysis::AnalysisError> {
        Ok(())
    }
}

impl Records for RunCollector {
    fn request(&mut self, _: usize, r: &RequestRecord) -> Result<(), analysis::AnalysisError> {
        self.record_request(r)
    }
    fn step(&mut self, _: usize, s: &StepRecord) -> Result<(), analysis::AnalysisError> {
        self.record_step(s)
    }
    fn itl(&mut self, _: usize, gaps: &[Nanos]) {
        self.record_itl(gaps);
    }
}

enum Event {
    Arrival(Request),
    /// A client sent a request to a front end with a serial part
    /// ([`Client::serial_request_ns`]): it queues there before its arrival.
    Sent(Request),
    /// A replica's step ended.
    StepDone(usize, StepPlan, StepOutcome),
    /// Plan a replica again at this instant (a step that only preempted).
    Wake(usize),
    /// The router reads the replicas' exported loads.
    Refresh,
    /// A disaggregated request's KV reached its decode replica.
    KvArrived(SeqId),
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
    /// The CPU offload tier's counters (`None`: no tier).
    pub offload: Option<engine::block_manager::offload::OffloadStats>,
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
    /// The front end's serial time per request (`cost.frontend_request_ms`): one process
    /// serves requests and streamed updates first come first served, a request before its
    /// `frontend_ns` delay.
    pub serial_request_ns: Nanos,
    /// The front end's serial time per streamed update (`cost.frontend_update_us`): every
    /// sequence that produced output in a step is one, and the client sees the step's
    /// tokens (a first token, a request's end) when the front end has sent them.
    pub serial_update_ns: Nanos,
    /// Spread of the think time: each pause adds a uniform draw in `[0, jitter_ns)`.
    pub jitter_ns: Nanos,
    /// Seed of those draws (the scenario's).
    pub seed: u64,
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
    /// Draws the think times' jitter below its bound (`None` without jitter).
    jitter: Option<(rand_chacha::ChaCha8Rng, Nanos)>,
    frontend_ns: Nanos,
    serial_request_ns: Nanos,
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
            jitter: (client.jitter_ns > 0).then(|| {
                // A stream of its own, apart from the workload's draws.
                let rng = rand::SeedableRng::seed_from_u64(client.seed ^ 0x7468_696e_6b5f_6a69);
                (rng, client.jitter_ns)
            }),
            frontend_ns: client.frontend_ns,
            serial_request_ns: client.serial_request_ns,
            held: None,
            scheduled: false,
            exhausted: false,
            last_arrival: 0,
        }
    }

    /// A request ended at `now`: its slot frees after the think time.
    fn release(&mut self, now: Nanos) {
        if self.cap.is_some() {
            let jitter = self
                .jitter
                .as_mut()
                .map_or(0, |(rng, bound)| rand::Rng::random_range(rng, 0..*bound));
            self.freed
                .push(Reverse(now.saturating_add(self.think_ns + jitter)));
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
        arrived: &mut u64,
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
        // A serial front end takes the send itself at `t` (never before `now`).
        let slot = if self.serial_request_ns > 0 {
            slot.max(now)
        } else if self.cap.is_some() {
            slot.max(now.saturating_sub(self.frontend_ns))
        } else {
            slot
        };
        let t = req.arrival.max(slot).max(self.last_arrival);
        self.last_arrival = t;
        req.arrival = t;
        *arrived += 1;
        self.scheduled = true;
        if self.serial_request_ns > 0 {
            clock.push(t, Event::Sent(req));
        } else {
            clock.push(t.saturating_add(self.frontend_ns), Event::Arrival(req));
        }
        Ok(())
    }
}

/// How long moving a prompt's KV takes: `(from replica, to replica, tokens)` -> its
/// [`TransferCost`].
pub type TransferTime<'a> = &'a dyn Fn(usize, usize, u32) -> TransferCost;

/// A prompt's KV move between two replicas: the bytes each GPU sends, how long they hold
/// the links, and the fixed cost on top (connection set-up, completion notice), which
/// does not.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TransferCost {
    /// Bytes over one GPU's link.
    pub bytes: f64,
    /// Time the bytes take at the link's bandwidth.
    pub wire: Nanos,
    /// Fixed cost after the bytes.
    pub latency: Nanos,
}

/// The links KV moves over: each replica's send and receive side (its GPUs' links, each
/// GPU sending or receiving its own shard). A transfer holds its prefill replica's send
/// side and its decode replica's receive side for its bytes' time, starting when both
/// are free (first come, first served), so transfers that end together on one replica
/// queue rather than each taking the whole bandwidth.
#[derive(Debug, Clone, Default)]
struct Links {
    send_free: Vec<Nanos>,
    recv_free: Vec<Nanos>,
}

impl Links {
    fn new(replicas: usize) -> Self {
        Links {
            send_free: vec![0; replicas],
            recv_free: vec![0; replicas],
        }
    }

    /// Books a transfer ready at `now` from `from` to `to`: when its bytes start to move,
    /// and when it arrives.
    fn book(&mut self, now: Nanos, from: usize, to: usize, c: TransferCost) -> (Nanos, Nanos) {
        let start = now.max(self.send_free[from]).max(self.recv_free[to]);
        let sent = start.saturating_add(c.wire);
        self.send_free[from] = sent;
        self.recv_free[to] = sent;
        (start, sent.saturating_add(c.latency))
    }
}

/// A fleet's front: its router, and the time KV takes between replicas (prefill/decode
/// disaggregation).
pub struct Front<'a, R> {
    /// The router.
    pub router: &'a mut R,
    /// KV transfer time.
    pub transfer: TransferTime<'a>,
    /// Each engine's lockstep group (the ranks of one attention-DP replica share one, in
    /// consecutive engines; ids below the engine count): its engines step together.
    pub groups: &'a [usize],
}

/// A prompt's KV moved from a prefill replica to a decode replica.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Transfer {
    /// The request.
    pub request: SeqId,
    /// The prefill replica.
    pub from: usize,
    /// The decode replica.
    pub to: usize,
    /// Prompt tokens whose KV moved.
    pub tokens: u32,
    /// Bytes moved over one GPU's link (each GPU sends its own shard; the larger shard of
    /// the two pools' layouts).
    pub bytes: f64,
    /// When the prefill finished (the transfer was ready).
    pub start: Nanos,
    /// When its bytes began to move: after `start` by the wait for the links (see
    /// [`Links`]).
    pub wire_start: Nanos,
    /// When the KV arrived (the decode replica admits the request then).
    pub end: Nanos,
}

/// A disaggregated request between its arrival and its decode: the request as sent, where
/// its decode goes, and its prefill's record once the prefill is done.
struct Ticket {
    request: Request,
    decode: usize,
    prefill: Option<(usize, RequestRecord)>,
}

/// A fleet run's counters: the whole, and each replica's.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FleetStats {
    /// Requests that arrived.
    pub arrived: u64,
    /// Requests that ended (finished or rejected).
    pub ended: u64,
    /// Simulated time of the last event.
    pub end_time: Nanos,
    /// Per replica (`arrived`: routed to it).
    pub replicas: Vec<RunStats>,
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
    let fleet = run_fleet(
        std::slice::from_mut(engine),
        None::<Front<'_, Router>>,
        workload,
        client,
        sink,
        progress,
    )
    .await?;
    let one = fleet.replicas.into_iter().next().unwrap_or_default();
    Ok(RunStats {
        arrived: fleet.arrived,
        ended: fleet.ended,
        end_time: fleet.end_time,
        ..one
    })
}

/// Runs a workload through a fleet of engines behind `router` (none: one engine, every
/// request to it) until every request has ended: [`run`] for many replicas on one clock.
pub async fn run_fleet<E: EngineHandle, R: RouterHandle>(
    engines: &mut [E],
    front: Option<Front<'_, R>>,
    workload: &mut dyn Iterator<Item = Result<Request, WorkloadError>>,
    client: Client,
    sink: &mut dyn Records,
    progress: &mut dyn FnMut(u64),
) -> Result<FleetStats, DriverError> {
    let n = engines.len();
    let mut clock = Clock::default();
    let mut stats = FleetStats {
        replicas: vec![RunStats::default(); n],
        ..FleetStats::default()
    };
    let mut arrived = 0u64;
    let mut busy = vec![false; n];
    // Pipelined engines (several micro-batches in flight, `max_concurrent_batches`): the
    // steps each has in flight, how many it may, and when its newest in flight ends.
    let mut in_flight = vec![0u32; n];
    let mut max_batches = vec![1u32; n];
    let mut last_done: Vec<Nanos> = vec![0; n];
    // The time of each pipelined engine's pending wake (to push each once).
    let mut wake_at: Vec<Nanos> = vec![0; n];
    // Lockstep groups (a replica's attention-DP ranks; every other engine alone), and when
    // each group's step under way ends.
    let group_of: Vec<usize> = match &front {
        Some(f) if !f.groups.is_empty() => {
            if f.groups.len() != n || f.groups.iter().any(|&g| g >= n) {
                return Err(DriverError::Backend(engine::backend::BackendError {
                    backend: "fleet".into(),
                    message: format!(
                        "{} lockstep groups given for {n} engines (one per engine, ids below {n})",
                        f.groups.len()
                    ),
                }));
            }
            f.groups.to_vec()
        }
        _ => (0..n).collect(),
    };
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (r, &g) in group_of.iter().enumerate() {
        if groups.len() <= g {
            groups.resize_with(g + 1, Vec::new);
        }
        groups[g].push(r);
    }
    let mut group_end: Vec<Nanos> = vec![0; groups.len()];
    let mut planned_groups: Vec<usize> = Vec::new();
    // The ranks of the group being planned that step, reused so that a step allocates
    // nothing here.
    let mut stepping = Vec::new();
    let mut ready: Vec<(usize, StepRecord, StepPlan)> = Vec::new();
    // Replicas whose state changed at this instant: planned once every event of the
    // instant is handled, in index order.
    let mut dirty = Dirty::new(n);
    let mut planning: Vec<usize> = Vec::with_capacity(n);
    // Where each replica last found nothing to run with work left (for a stall report).
    let mut idle_with_work: Vec<Option<(Nanos, u32, u32)>> = vec![None; n];
    let mut slots = Slots::new(client);
    // The front end's serial process ([`Client::serial_request_ns`],
    // [`Client::serial_update_ns`]): when it is next free, and how long after its step
    // each sequence's first token reached the client (only sequences in flight).
    let mut frontend_free: Nanos = 0;
    // The last token a client saw (the run lasts until then).
    let mut delivered_end: Nanos = 0;
    let mut first_delay: rustc_hash::FxHashMap<SeqId, Nanos> = rustc_hash::FxHashMap::default();
    slots.send_next(workload, &mut clock, &mut arrived, 0)?;
    let mut pool_blocks = Vec::with_capacity(n);
    let mut block_sizes = Vec::with_capacity(n);
    for e in engines.iter_mut() {
        pool_blocks.push(e.pool_usage().await?.1);
        block_sizes.push(e.block_size().await?);
    }
    let (mut router, transfer) = match front {
        Some(f) => (Some(f.router), Some(f.transfer)),
        None => (None, None),
    };
    let mut links = Links::new(n);
    // Disaggregated requests between arrival and decode (only live ones).
    let mut tickets: rustc_hash::FxHashMap<SeqId, Ticket> = rustc_hash::FxHashMap::default();
    let refresh_ns = router.as_ref().map_or(0, |r| r.refresh_ns());
    if router.is_some() && refresh_ns > 0 {
        clock.push(refresh_ns, Event::Refresh);
    }

    while let Some(ev) = clock.pop() {
        let now = ev.time;
        // A refresh outlives the last real event by up to `refresh_ns`: it is not the run's
        // end.
        if !matches!(ev.event, Event::Refresh) {
            stats.end_time = now;
        }
        // A request handed to a replica: a client's arrival, or a disaggregated request's
        // KV reaching its decode replica.
        let mut delivery: Option<(Request, usize)> = None;
        match ev.event {
            Event::Sent(req) => {
                // The front end serves the request when it is free, then the request
                // takes the front end's delay to the scheduler.
                slots.scheduled = false;
                let done = frontend_free
                    .max(now)
                    .saturating_add(client.serial_request_ns);
                frontend_free = done;
                clock.push(done.saturating_add(client.frontend_ns), Event::Arrival(req));
                slots.send_next(workload, &mut clock, &mut arrived, now)?;
            }
            Event::Arrival(req) => {
                if client.serial_request_ns == 0 {
                    slots.scheduled = false;
                }
                let (req, r) = match router.as_deref_mut() {
                    None => (req, 0),
                    Some(router) => {
                        if refresh_ns == 0 {
                            let loads = loads(engines).await?;
                            router.refresh(loads, now).await?;
                        }
                        let (req, d) = router.route(req, now).await?;
                        sink.route(&d)?;
                        match d.decode {
                            None => (req, d.replica),
                            Some(decode) => {
                                // vLLM's disaggregated proxy: the prefill replica computes
                                // the prompt and one token, and holds the KV for the send.
                                let prefill = Request {
                                    max_tokens: 1,
                                    n: 1,
                                    beam_search: false,
                                    hold_kv: true,
                                    ..req.clone()
                                };
                                tickets.insert(
                                    req.id,
                                    Ticket {
                                        request: req,
                                        decode,
                                        prefill: None,
                                    },
                                );
                                (prefill, d.replica)
                            }
                        }
                    }
                };
                delivery = Some((req, r));
            }
            Event::Wake(r) => dirty.mark(r),
            Event::KvArrived(id) => {
                // The prefill replica frees the KV it held; the decode replica admits the
                // request with that KV computed.
                let Some(t) = tickets.get(&id) else {
                    return Err(RouterError::NotInFlight(id).into());
                };
                let (from, to) = (t.prefill.as_ref().map_or(0, |p| p.0), t.decode);
                engines[from].free_held(vec![id]).await?;
                dirty.mark(from);
                let req = Request {
                    kv_ready: t.request.prompt_len,
                    ..t.request.clone()
                };
                delivery = Some((req, to));
            }
            Event::Refresh => {
                if let Some(router) = router.as_deref_mut() {
                    let loads = loads(engines).await?;
                    router.refresh(loads, now).await?;
                }
                // Refresh while anything else is on the clock (the run ends with it).
                if clock.peek_time().is_some() {
                    clock.push(now.saturating_add(refresh_ns), Event::Refresh);
                }
            }
            Event::StepDone(r, plan, outcome) => {
                in_flight[r] = in_flight[r].saturating_sub(1);
                busy[r] = in_flight[r] > 0;
                // The front end sends the step's updates (one per sequence with output)
                // after what it already holds; the client sees them `delay` after the step.
                let mut delay: Nanos = 0;
                if client.serial_update_ns > 0 {
                    let updates = plan.work.iter().filter(|w| w.sample).count() as u64;
                    if updates > 0 {
                        let done = frontend_free
                            .max(now)
                            .saturating_add(updates.saturating_mul(client.serial_update_ns));
                        frontend_free = done;
                        delay = done - now;
                    }
                    for w in &plan.work {
                        if w.sample && w.kind == engine::plan::WorkKind::Prefill {
                            first_delay.entry(w.seq).or_insert(delay);
                        }
                    }
                }
                let (mut result, gaps) = engines[r].commit(plan, outcome, now).await?;
                sink.itl(r, &gaps);
                if !tickets.is_empty() {
                    // Disaggregated requests: a prefill's end starts its KV transfer; a
                    // decode's end is the request's, with the prefill's facts merged in.
                    let mut ended = Vec::with_capacity(result.finished.len());
                    for rec in std::mem::take(&mut result.finished) {
                        let id = rec.request_id;
                        match tickets.get_mut(&id) {
                            Some(t) if t.prefill.is_none() => {
                                sink.prefilled(r, &rec)?;
                                stats.replicas[r].ended += 1;
                                let tokens = t.request.prompt_len;
                                let cost = transfer
                                    .map_or(TransferCost::default(), |f| f(r, t.decode, tokens));
                                let (wire_start, end) = links.book(now, r, t.decode, cost);
                                sink.transfer(&Transfer {
                                    request: id,
                                    from: r,
                                    to: t.decode,
                                    tokens,
                                    bytes: cost.bytes,
                                    start: now,
                                    wire_start,
                                    end,
                                })?;
                                if let Some(router) = router.as_deref_mut() {
                                    router.handoff(id, r, t.decode).await?;
                                }
                                t.prefill = Some((r, rec));
                                first_delay.remove(&id);
                                clock.push(end, Event::KvArrived(id));
                            }
                            Some(_) => ended.push(merged(tickets.remove(&id), rec)),
                            None => ended.push(rec),
                        }
                    }
                    result.finished = ended;
                }
                if client.serial_update_ns > 0 {
                    for rec in &mut result.finished {
                        let first = first_delay.remove(&rec.request_id).unwrap_or(delay);
                        rec.first_token_ns = rec.first_token_ns.map(|t| t.saturating_add(first));
                        rec.finish_ns = rec.finish_ns.saturating_add(delay);
                        delivered_end = delivered_end.max(rec.finish_ns);
                    }
                }
                for rec in &result.finished {
                    sink.request(r, rec)?;
                }
                if !result.finished.is_empty() {
                    let k = result.finished.len() as u64;
                    stats.ended += k;
                    stats.replicas[r].ended += k;
                    progress(stats.ended);
                    for _ in &result.finished {
                        slots.release(now.saturating_add(delay));
                    }
                    if let Some(router) = router.as_deref_mut() {
                        let ids = result.finished.iter().map(|f| f.request_id).collect();
                        router.ended(ids, r).await?;
                    }
                    slots.send_next(workload, &mut clock, &mut arrived, now)?;
                }
                dirty.mark(r);
            }
        }
        if let Some((req, r)) = delivery {
            let id = req.id;
            stats.replicas[r].arrived += 1;
            if let Some(rejected) = engines[r].arrive(req, now).await? {
                let rec = merged(tickets.remove(&id), rejected);
                sink.request(r, &rec)?;
                stats.ended += 1;
                stats.replicas[r].ended += 1;
                progress(stats.ended);
                slots.release(now);
                if let Some(router) = router.as_deref_mut() {
                    router.ended(vec![id], r).await?;
                }
            }
            slots.send_next(workload, &mut clock, &mut arrived, now)?;
            dirty.mark(r);
        }
        // Every event at this instant is handled before a worker is given a step.
        if clock.peek_time() == Some(now) {
            continue;
        }
        dirty.take_into(&mut planning);
        planned_groups.clear();
        for &r in &planning {
            // The engines of a replica's attention-DP ranks step in lockstep (their MoE
            // layers exchange tokens every layer): a step starts on all of them at once,
            // when the last one's ended, and lasts as long as the longest.
            let g = group_of[r];
            // A group is planned once a pass (its other dirty ranks were planned with it).
            let members = &groups[g];
            if max_batches[r] > 1 && in_flight[r] < max_batches[r] && group_end[g] > now {
                // A pipelined engine's first stage is still busy: try again when it frees.
                if wake_at[r] != group_end[g] {
                    wake_at[r] = group_end[g];
                    clock.push(group_end[g], Event::Wake(r));
                }
                continue;
            }
            if group_end[g] > now
                || in_flight[r] >= max_batches[r]
                || (members.len() > 1 && planned_groups.contains(&g))
            {
                continue;
            }
            if members.len() > 1 {
                planned_groups.push(g);
            }
            stepping.clear();
            ready.clear();
            let mut longest: Nanos = 0;
            for &m in members {
                let mut planned = engines[m].plan(now).await?;
                // Nothing runs, but the preemptions changed the pool (a contiguous
                // allocator that could not grow a sequence in place): record them and plan
                // again now (an engine alone at the next pass; a rank of a group at once,
                // so as not to miss its group's step).
                let mut later = false;
                while let Some(p) = planned.as_ref().filter(|p| {
                    p.plan.is_empty() && !p.plan.has_transfers() && !p.plan.preempted.is_empty()
                }) {
                    let outcome = StepOutcome::default();
                    let rec = step_record(p, &outcome, pool_blocks[m], block_sizes[m]);
                    sink.step(m, &rec)?;
                    if members.len() == 1 {
                        clock.push(now, Event::Wake(m));
                        later = true;
                        break;
                    }
                    planned = engines[m].plan(now).await?;
                }
                if later {
                    continue;
                }
                let Some(planned) = planned else {
                    idle_with_work[m] = None;
                    continue;
                };
                let transfers = planned.plan.has_transfers();
                if planned.plan.is_empty() && !transfers {
                    idle_with_work[m] = Some((now, planned.num_waiting, planned.num_running));
                    continue;
                }
                idle_with_work[m] = None;
                let record = step_record(
                    &planned,
                    &StepOutcome::default(),
                    pool_blocks[m],
                    block_sizes[m],
                );
                // A rank of a lockstep group runs one step at a time.
                max_batches[m] = if members.len() > 1 {
                    1
                } else {
                    planned.max_batches.max(1)
                };
                ready.push((m, record, planned.plan));
            }
            if members.len() > 1 {
                // The ranks' MoE layers compute every rank's tokens of this step.
                let all: u64 = ready
                    .iter()
                    .flat_map(|(_, _, p)| p.work.iter().map(|w| u64::from(w.len)))
                    .sum();
                let all = u32::try_from(all).unwrap_or(u32::MAX);
                for (_, _, plan) in &mut ready {
                    plan.moe_group_tokens = Some(all);
                }
            }
            for (m, record, plan) in ready.drain(..) {
                let (plan, outcome) = engines[m].execute(plan).await?;
                longest = longest.max(outcome.duration.max(1));
                stepping.push((m, record, plan, outcome));
            }
            let Some(step) = stepping.first().map(|s| s.2.step) else {
                continue;
            };
            let mut done = now.checked_add(longest).ok_or_else(|| {
                DriverError::Backend(engine::backend::BackendError {
                    backend: "clock".into(),
                    message: format!(
                        "step {step} of {longest} ns at t = {now} ns overflows the simulated clock"
                    ),
                })
            })?;
            group_end[g] = done;
            // A pipelined engine starts its next micro-batch once the first stage is free;
            // a batch cannot overtake the one ahead of it through the stages, so it ends
            // at least a stage after that one.
            let interval = stepping[0].3.interval;
            if members.len() == 1 && max_batches[r] > 1 && interval > 0 {
                done = done.max(last_done[r].saturating_add(interval));
                group_end[g] = now.saturating_add(interval);
                last_done[r] = done;
                if in_flight[r] + 1 < max_batches[r] {
                    wake_at[r] = group_end[g];
                    clock.push(group_end[g], Event::Wake(r));
                }
            }
            let pipelined = members.len() == 1 && max_batches[r] > 1 && interval > 0;
            for (m, record, plan, outcome) in stepping.drain(..) {
                sink.step(
                    m,
                    &StepRecord {
                        // A rank's step lasts as long as its group's; a micro-batch
                        // until it leaves the last stage.
                        duration_ns: if members.len() > 1 {
                            longest
                        } else if pipelined {
                            done - now
                        } else {
                            outcome.duration
                        },
                        mbu: outcome.mbu,
                        mfu: outcome.mfu,
                        ..record
                    },
                )?;
                stats.replicas[m].steps += 1;
                busy[m] = true;
                in_flight[m] += 1;
                stats.replicas[m].end_time = stats.replicas[m].end_time.max(done);
                clock.push(done, Event::StepDone(m, plan, outcome));
            }
            // The ranks without work this step plan again when it ends.
            for &m in members {
                if !busy[m] {
                    clock.push(done, Event::Wake(m));
                }
            }
        }
    }
    stats.arrived = arrived;
    if stats.ended < stats.arrived {
        // Work is left and nothing is on the clock: some replica cannot make progress.
        let (time_ns, waiting, running) = idle_with_work
            .iter()
            .flatten()
            .next()
            .copied()
            .unwrap_or((stats.end_time, 0, 0));
        return Err(EngineError::Stalled {
            time_ns,
            waiting: waiting as usize,
            running: running as usize,
        }
        .into());
    }
    if let Some(router) = router {
        // Every routed request ended on the replica it was sent to (checked as each
        // ended): nothing may be left counted in flight.
        let left = router
            .refresh(loads(engines).await?, stats.end_time)
            .await?;
        if left > 0 {
            return Err(RouterError::LeftInFlight(left).into());
        }
    }
    for (e, s) in engines.iter_mut().zip(&mut stats.replicas) {
        let (used, pool, evictions) = e.pool_usage().await?;
        s.blocks_in_use_at_end = used;
        s.pool_blocks = pool;
        s.evictions = evictions;
        s.spec = e.spec_stats().await?;
        s.offload = e.offload_stats().await?;
    }
    stats.end_time = stats.end_time.max(delivered_end);
    Ok(stats)
}

/// Replicas whose state changed at the current instant.
struct Dirty {
    list: Vec<usize>,
    flags: Vec<bool>,
}

impl Dirty {
    fn new(n: usize) -> Self {
        Dirty {
            list: Vec::new(),
            flags: vec![false; n],
        }
    }

    fn mark(&mut self, r: usize) {
        if !self.flags[r] {
            self.flags[r] = true;
            self.list.push(r);
        }
    }

    /// The marked replicas in index order into `out` (cleared first; reused, so that an
    /// instant allocates nothing), unmarked.
    fn take_into(&mut self, out: &mut Vec<usize>) {
        out.clear();
        std::mem::swap(&mut self.list, out);
        out.sort_unstable();
        for &r in out.iter() {
            self.flags[r] = false;
        }
    }
}

/// A disaggregated request's record: its decode's, with what happened before the decode
/// (the first scheduling, prefix-cache hits and preemptions on the prefill replica).
fn merged(ticket: Option<Ticket>, decode: RequestRecord) -> RequestRecord {
    let Some((_, p)) = ticket.and_then(|t| t.prefill) else {
        return decode;
    };
    RequestRecord {
        first_scheduled_ns: p.first_scheduled_ns.or(decode.first_scheduled_ns),
        cached_tokens: p.cached_tokens,
        num_preemptions: p.num_preemptions + decode.num_preemptions,
        ..decode
    }
}

/// Every replica's exported load, in order.
async fn loads<E: EngineHandle>(engines: &mut [E]) -> Result<Vec<Load>, DriverError> {
    let mut out = Vec::with_capacity(engines.len());
    for e in engines.iter_mut() {
        out.push(e.load().await?);
    }
    Ok(out)
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

/// Runs a fleet to completion with the chosen driver: every replica's cores (inline) or
/// actors, and the router core (inline) or its actor, on one clock.
pub fn run_fleet_to_end(
    kind: DriverKind,
    parts: Vec<EngineParts>,
    (router, transfer, groups): (Router, TransferTime<'_>, &[usize]),
    workload: &mut dyn Iterator<Item = Result<Request, WorkloadError>>,
    client: Client,
    sink: &mut dyn Records,
    progress: &mut dyn FnMut(u64),
) -> Result<FleetStats, DriverError> {
    match kind {
        DriverKind::Inline => {
            let mut engines: Vec<InlineEngine> = parts
                .into_iter()
                .map(|p| InlineEngine::new(p.scheduler, p.block_manager, p.backend))
                .collect();
            let mut router = router;
            futures_executor::block_on(run_fleet(
                &mut engines,
                Some(Front {
                    router: &mut router,
                    transfer,
                    groups,
                }),
                workload,
                client,
                sink,
                progress,
            ))
        }
        DriverKind::Actors => {
            let system = actix::System::new();
            system.block_on(async move {
                let mut engines: Vec<ActorEngine> = parts
                    .into_iter()
                    .map(|p| ActorEngine::start(p.scheduler, p.block_manager, p.backend))
                    .collect();
                let mut router = ActorRouter::start(router);
                run_fleet(
                    &mut engines,
                    Some(Front {
                        router: &mut router,
                        transfer,
                        groups,
                    }),
                    workload,
                    client,
                    sink,
                    progress,
                )
                .await
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Links, TransferCost};

    fn cost(wire: u64, latency: u64) -> TransferCost {
        TransferCost {
            bytes: 1.0,
            wire,
            latency,
        }
    }

    /// Transfers from one sender queue for its link; the fixed latency does not hold it;
    /// a receiver busy with another sender's bytes delays a transfer too; disjoint pairs
    /// do not wait on each other.
    #[test]
    fn links_queue_transfers_that_share_a_side() {
        let mut l = Links::new(4);
        assert_eq!(l.book(100, 0, 2, cost(50, 7)), (100, 157));
        // Same sender, other receiver: waits for the first's bytes, not its latency.
        assert_eq!(l.book(100, 0, 3, cost(50, 7)), (150, 207));
        // Other sender, first receiver (free since 150).
        assert_eq!(l.book(120, 1, 2, cost(10, 0)), (150, 160));
        // A pair nobody used runs at once.
        let mut l = Links::new(4);
        l.book(0, 0, 1, cost(1_000, 0));
        assert_eq!(l.book(5, 2, 3, cost(10, 0)), (5, 15));
        // A late transfer finds the links free.
        assert_eq!(l.book(2_000, 0, 1, cost(10, 3)), (2_000, 2_013));
    }
}
