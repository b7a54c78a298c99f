//! The cost model as an engine [`Backend`]: each step's duration from the roofline (plus the
//! draft model's rounds under speculative decoding), synthetic tokens, acceptances drawn by
//! the engine's acceptance model, and the step's MBU and MFU.

use engine::backend::{Backend, BackendError, SIM_TOKEN};
use engine::plan::{StepOutcome, StepPlan};

use super::CostModel;

/// The cost model as an engine backend.
pub struct CostModelBackend {
    model: CostModel,
    /// The draft model of speculative decoding (`method = draft-model`), costed on the
    /// same GPUs before each verify, and whether it shares the target's KV.
    draft: Option<(CostModel, bool)>,
    sampled: Vec<u32>,
}

impl CostModelBackend {
    /// Wraps a cost model.
    pub fn new(model: CostModel) -> Self {
        CostModelBackend {
            model,
            draft: None,
            sampled: Vec::new(),
        }
    }

    /// Adds a draft model whose drafting time each step pays (`shares_kv`: a
    /// self-speculation draft, the target's first layers, with no prefill of its own).
    pub fn with_draft(mut self, draft: CostModel, shares_kv: bool) -> Self {
        self.draft = Some((draft, shares_kv));
        self
    }
}

impl Backend for CostModelBackend {
    fn name(&self) -> &str {
        "model"
    }

    fn execute(&mut self, plan: &StepPlan) -> Result<StepOutcome, BackendError> {
        let mut c = self.model.plan_cost(plan);
        if let Some((draft, shares_kv)) = &self.draft {
            c.seconds += draft.draft_seconds(plan, *shares_kv);
        }
        let d = self.model.deployment();
        let duration = (c.seconds * 1e9).round().max(1.0) as u64;
        // Under pipeline parallelism the next micro-batch may start once the first stage
        // is free: after the step's GPU time split evenly over the stages (their layers
        // are), but no sooner than the engine's CPU has prepared it.
        let interval = if d.pp > 1 {
            let cpu_s = c.overhead_s - c.p2p_s;
            let stage_s = (c.seconds - cpu_s) / f64::from(d.pp);
            ((stage_s.max(cpu_s) * 1e9).round().max(1.0) as u64).min(duration)
        } else {
            0
        };
        // Synthetic acceptance stands in for verification.
        let accepted = engine::plan::simulated_acceptances(plan);
        let samples = StepOutcome::expected_samples(plan, &accepted);
        self.sampled.clear();
        self.sampled.resize(samples, SIM_TOKEN);
        Ok(StepOutcome {
            duration,
            interval,
            sampled: self.sampled.clone(),
            accepted,
            // The stages of a pipeline share the step's traffic and FLOPs.
            mbu: c.bytes / f64::from(d.pp.max(1)) / (c.seconds * d.gpu.mem_bw),
            mfu: c.flops / f64::from(d.pp.max(1)) / (c.seconds * d.gpu.peak_flops(d.dtype)),
            // Placeholder tokens have no probabilities.
            logprobs: Vec::new(),
        })
    }
}
