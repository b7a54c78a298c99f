//! The scheduler and block-manager cores driven in one thread, one call per step: what the
//! actors do with one message each, for the inline driver and for tests.

use crate::actors::PlannedStep;
use crate::block_manager::BlockManager;
use crate::error::EngineError;
use crate::plan::{StepOutcome, StepPlan};
use crate::record::RequestRecord;
use crate::request::{Nanos, Request};
use crate::scheduler::{CommitResult, Scheduler};

/// A scheduler and its block manager.
pub struct Cores {
    /// The scheduler core.
    pub scheduler: Scheduler,
    /// The block-manager core.
    pub block_manager: BlockManager,
}

impl Cores {
    /// Pairs a scheduler with its block manager.
    pub fn new(scheduler: Scheduler, block_manager: BlockManager) -> Self {
        Cores {
            scheduler,
            block_manager,
        }
    }

    /// Plans the step at `now` (one reservation); `None` when nothing waits or runs.
    pub fn plan(&mut self, now: Nanos) -> Option<PlannedStep> {
        if !self.scheduler.has_work() {
            return None;
        }
        let req = self.scheduler.propose(now);
        let resp = self.block_manager.reserve(&req);
        let blocks_used = resp.blocks_used;
        let plan = self.scheduler.apply(&req, resp, now);
        Some(PlannedStep::new(&self.scheduler, plan, blocks_used))
    }

    /// Commits a step's outcome at `now` (its end), then caches the newly full blocks,
    /// forks the new parallel-sampling sequences and frees the finished ones.
    pub fn commit(
        &mut self,
        plan: &StepPlan,
        outcome: &StepOutcome,
        now: Nanos,
    ) -> Result<CommitResult, EngineError> {
        let result = self.scheduler.commit(plan, outcome, now)?;
        self.block_manager.release(
            &result.cache,
            &result.rollback,
            &result.forks,
            &result.to_free,
        );
        Ok(result)
    }

    /// Replays `requests` (in arrival order) with steps of a fixed `step_ns` and placeholder
    /// tokens (a cost-free backend, for tests and quick checks), checking the pool's
    /// invariants after every step when `check` is set (it costs a pass over the pool);
    /// returns every record, finished or rejected, by request id. Fails on an engine error,
    /// a broken invariant, or a run that stops draining.
    pub fn replay(
        &mut self,
        requests: impl IntoIterator<Item = Request>,
        step_ns: Nanos,
        check: bool,
    ) -> Result<Vec<RequestRecord>, EngineError> {
        let mut pending = requests.into_iter().peekable();
        let (mut records, mut now, mut idle_steps) = (Vec::new(), 0, 0u64);
        loop {
            while let Some(r) = pending.next_if(|r| r.arrival <= now) {
                records.extend(self.scheduler.add_request(r, now));
            }
            let Some(planned) = self.plan(now) else {
                match pending.peek() {
                    Some(r) => {
                        now = r.arrival;
                        continue;
                    }
                    None => break,
                }
            };
            if check {
                self.block_manager
                    .check_invariants()
                    .map_err(|e| EngineError::Backend(format!("at {now} ns: {e}")))?;
            }
            idle_steps = if planned.plan.is_empty() {
                idle_steps + 1
            } else {
                0
            };
            if idle_steps > 1000 {
                return Err(EngineError::Stalled {
                    time_ns: now,
                    waiting: self.scheduler.num_waiting(),
                    running: self.scheduler.num_running(),
                });
            }
            now += step_ns.max(1);
            let outcome = StepOutcome::simulated(&planned.plan, step_ns.max(1));
            records.extend(self.commit(&planned.plan, &outcome, now)?.finished);
        }
        records.sort_by_key(|r| r.request_id);
        Ok(records)
    }
}
