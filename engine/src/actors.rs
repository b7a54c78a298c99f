//! The actix actors: scheduler, block manager and worker.
//!
//! Each actor wraps a plain core ([`Scheduler`], [`BlockManager`], a [`Backend`]) and moves
//! one message per step, never one per token or per sequence. The scheduler asks the block
//! manager inside an [`AtomicResponse`], so no other message interleaves while a step is
//! being planned or committed. Everything runs on one arbiter: arrival order, and so the
//! results, are deterministic.

use actix::prelude::*;

use crate::backend::{Backend, BackendError};
use crate::block_manager::{BlockManager, ReserveRequest, ReserveResponse};
use crate::error::EngineError;
use crate::plan::{StepOutcome, StepPlan};
use crate::record::RequestRecord;
use crate::request::{Nanos, Request, SeqId};
use crate::scheduler::{CommitResult, Scheduler, StepStats};

/// Owns the KV block pool.
pub struct BlockManagerActor {
    core: BlockManager,
}

impl BlockManagerActor {
    /// Wraps a block manager.
    pub fn new(core: BlockManager) -> Self {
        BlockManagerActor { core }
    }
}

impl Actor for BlockManagerActor {
    type Context = Context<Self>;
}

/// Reserve blocks for one step (scheduler -> block manager).
#[derive(Message)]
#[rtype(result = "ReserveResponse")]
pub struct Reserve(pub ReserveRequest);

impl Handler<Reserve> for BlockManagerActor {
    type Result = MessageResult<Reserve>;
    fn handle(&mut self, msg: Reserve, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.core.reserve(&msg.0))
    }
}

/// Cache newly full blocks, roll verify steps back, fork parallel-sampling sequences,
/// then free the blocks of finished sequences (scheduler -> block manager, once per step). Answers the number of blocks still in use.
#[derive(Message)]
#[rtype(result = "u32")]
pub struct Release {
    /// Blocks to register in the prefix cache.
    pub cache: Vec<crate::block_manager::CacheBlocks>,
    /// Verify steps rolled back to their verified tokens: `(sequence, tokens kept)`.
    pub rollback: Vec<(u64, u32)>,
    /// `(parent, child)` forks of parallel sampling, applied before the frees.
    pub fork: Vec<(u64, u64)>,
    /// Sequences to free.
    pub free: Vec<u64>,
}

impl Handler<Release> for BlockManagerActor {
    type Result = u32;
    fn handle(&mut self, msg: Release, _: &mut Context<Self>) -> u32 {
        self.core
            .release(&msg.cache, &msg.rollback, &msg.fork, &msg.free);
        self.core.num_used()
    }
}

/// Asks for `(blocks in use, pool size, evictions so far)`.
#[derive(Message)]
#[rtype(result = "(u32, u32, u64)")]
pub struct PoolUsage;

impl Handler<PoolUsage> for BlockManagerActor {
    type Result = MessageResult<PoolUsage>;
    fn handle(&mut self, _: PoolUsage, _: &mut Context<Self>) -> Self::Result {
        MessageResult((
            self.core.num_used(),
            self.core.num_blocks(),
            self.core.evictions(),
        ))
    }
}

/// Asks for the CPU offload tier's counters (`None`: no tier).
#[derive(Message)]
#[rtype(result = "Option<crate::block_manager::offload::OffloadStats>")]
pub struct OffloadCounters;

impl Handler<OffloadCounters> for BlockManagerActor {
    type Result = MessageResult<OffloadCounters>;
    fn handle(&mut self, _: OffloadCounters, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.core.offload_stats())
    }
}

/// Owns the scheduler core and talks to the block manager.
pub struct SchedulerActor {
    core: Scheduler,
    block_manager: Addr<BlockManagerActor>,
}

impl SchedulerActor {
    /// Wraps a scheduler that reserves blocks through `block_manager`.
    pub fn new(core: Scheduler, block_manager: Addr<BlockManagerActor>) -> Self {
        SchedulerActor {
            core,
            block_manager,
        }
    }
}

impl Actor for SchedulerActor {
    type Context = Context<Self>;
}

/// A request arrives; answers its record if it is rejected on arrival.
#[derive(Message)]
#[rtype(result = "Option<RequestRecord>")]
pub struct Arrive(pub Request, pub Nanos);

/// Asks for speculative decoding's acceptance counters, by request class.
#[derive(Message)]
#[rtype(result = "Vec<crate::spec::SpecStats>")]
pub struct SpecCounters;

impl Handler<SpecCounters> for SchedulerActor {
    type Result = MessageResult<SpecCounters>;
    fn handle(&mut self, _: SpecCounters, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.core.spec_stats().to_vec())
    }
}

/// Asks for `(waiting requests, running sequences)`: what a replica exports to a fleet's
/// router.
#[derive(Message)]
#[rtype(result = "(u32, u32)")]
pub struct QueueState;

impl Handler<QueueState> for SchedulerActor {
    type Result = MessageResult<QueueState>;
    fn handle(&mut self, _: QueueState, _: &mut Context<Self>) -> Self::Result {
        MessageResult((
            self.core.num_waiting() as u32,
            self.core.num_running() as u32,
        ))
    }
}

/// End this live request early, for this reason, at this time ([`Scheduler::abort`]): the
/// record of a request that left the queue at once.
#[derive(Message)]
#[rtype(result = "Option<RequestRecord>")]
pub struct Abort(pub SeqId, pub crate::request::FinishReason, pub Nanos);

/// End choice `.1` of live request `.0` early, for this reason
/// ([`Scheduler::abort_choice`]).
#[derive(Message)]
#[rtype(result = "()")]
pub struct AbortChoice(pub SeqId, pub u32, pub crate::request::FinishReason);

impl Handler<AbortChoice> for SchedulerActor {
    type Result = ();
    fn handle(&mut self, msg: AbortChoice, _: &mut Context<Self>) {
        self.core.abort_choice(msg.0, msg.1, msg.2)
    }
}

impl Handler<Abort> for SchedulerActor {
    type Result = Option<RequestRecord>;
    fn handle(&mut self, msg: Abort, _: &mut Context<Self>) -> Self::Result {
        self.core.abort(msg.0, msg.1, msg.2)
    }
}

impl Handler<Arrive> for SchedulerActor {
    type Result = Option<RequestRecord>;
    fn handle(&mut self, msg: Arrive, _: &mut Context<Self>) -> Self::Result {
        self.core.add_request(msg.0, msg.1)
    }
}

/// A planned step with the queue state after planning.
#[derive(Debug)]
pub struct PlannedStep {
    /// The plan (may be empty when nothing fits now).
    pub plan: StepPlan,
    /// Blocks in use after the reservation.
    pub blocks_used: u32,
    /// Waiting requests after planning.
    pub num_waiting: u32,
    /// Running sequences after planning.
    pub num_running: u32,
    /// Scheduler-side facts about the step (KV tokens held, recomputation, swaps).
    pub stats: StepStats,
    /// Steps the scheduler lets be in flight at once (`max_concurrent_batches`).
    pub max_batches: u32,
}

impl PlannedStep {
    /// Wraps the plan `sched` just made, with its queue state.
    pub fn new(sched: &Scheduler, plan: StepPlan, blocks_used: u32) -> Self {
        PlannedStep {
            plan,
            blocks_used,
            num_waiting: sched.num_waiting() as u32,
            num_running: sched.num_running() as u32,
            stats: sched.last_step_stats(),
            max_batches: sched.config().max_concurrent_batches,
        }
    }
}

/// Plan the next step at the given time (clock -> scheduler). `None` when there is no work.
#[derive(Message)]
#[rtype(result = "Result<Option<PlannedStep>, EngineError>")]
pub struct PlanStep(pub Nanos);

impl Handler<PlanStep> for SchedulerActor {
    type Result = AtomicResponse<Self, Result<Option<PlannedStep>, EngineError>>;
    fn handle(&mut self, msg: PlanStep, _: &mut Context<Self>) -> Self::Result {
        if !self.core.has_work() {
            return AtomicResponse::new(Box::pin(fut::ready(Ok(None))));
        }
        let req = self.core.propose(msg.0);
        let bm = self.block_manager.clone();
        let now = msg.0;
        AtomicResponse::new(Box::pin(
            async move {
                let resp = bm.send(Reserve(req.clone())).await;
                (req, resp)
            }
            .into_actor(self)
            .map(move |(req, resp), act, _| {
                let resp = resp.map_err(|e| EngineError::Mailbox(e.to_string()))?;
                let blocks_used = resp.blocks_used;
                let plan = act.core.apply(&req, resp, now);
                Ok(Some(PlannedStep::new(&act.core, plan, blocks_used)))
            }),
        ))
    }
}

/// Commit a finished step (clock -> scheduler); the scheduler then frees the finished
/// sequences' blocks in one message to the block manager.
#[derive(Message)]
#[rtype(result = "Result<(CommitResult, Vec<Nanos>), EngineError>")]
pub struct CommitStep {
    /// The executed plan.
    pub plan: StepPlan,
    /// The backend's outcome.
    pub outcome: StepOutcome,
    /// Time the step ended.
    pub now: Nanos,
}

impl Handler<CommitStep> for SchedulerActor {
    type Result = AtomicResponse<Self, Result<(CommitResult, Vec<Nanos>), EngineError>>;
    fn handle(&mut self, msg: CommitStep, _: &mut Context<Self>) -> Self::Result {
        let committed = self.core.commit(&msg.plan, &msg.outcome, msg.now);
        let gaps: Vec<Nanos> = self.core.take_itl_gaps().collect();
        let bm = self.block_manager.clone();
        AtomicResponse::new(Box::pin(
            async move {
                let mut result = committed?;
                if !result.to_free.is_empty()
                    || !result.cache.is_empty()
                    || !result.forks.is_empty()
                    || !result.rollback.is_empty()
                {
                    bm.send(Release {
                        cache: std::mem::take(&mut result.cache),
                        rollback: result.rollback.clone(),
                        fork: result.forks.clone(),
                        free: result.to_free.clone(),
                    })
                    .await
                    .map_err(|e| EngineError::Mailbox(e.to_string()))?;
                }
                Ok((result, gaps))
            }
            .into_actor(self),
        ))
    }
}

/// Runs steps on a backend.
pub struct WorkerActor {
    backend: Box<dyn Backend>,
}

impl WorkerActor {
    /// Wraps a backend.
    pub fn new(backend: Box<dyn Backend>) -> Self {
        WorkerActor { backend }
    }
}

impl Actor for WorkerActor {
    type Context = Context<Self>;
}

/// Execute a step (clock -> worker); the plan comes back with the outcome.
#[derive(Message)]
#[rtype(result = "Result<(StepPlan, StepOutcome), BackendError>")]
pub struct Execute(pub StepPlan);

impl Handler<Execute> for WorkerActor {
    type Result = Result<(StepPlan, StepOutcome), BackendError>;
    fn handle(&mut self, msg: Execute, _: &mut Context<Self>) -> Self::Result {
        let outcome = self.backend.execute(&msg.0)?;
        Ok((msg.0, outcome))
    }
}
