//! The `Backend` trait: the only thing the engine knows about execution.

use crate::plan::{StepOutcome, StepPlan};

/// Error raised by a backend while executing a step.
#[derive(Debug, thiserror::Error)]
#[error("backend `{backend}`: {message}")]
pub struct BackendError {
    /// Backend name.
    pub backend: String,
    /// What went wrong.
    pub message: String,
}

/// Executes one step. The cost model predicts the duration; real runtimes run the model and
/// measure it. Everything above this trait is the same code path for all backends.
pub trait Backend {
    /// Short name (`model`, `cpu`, `cuda`).
    fn name(&self) -> &str;

    /// Whether `StepPlan`s must carry block tables (real runtimes read and write KV there).
    fn needs_block_tables(&self) -> bool {
        false
    }

    /// Runs one step.
    fn execute(&mut self, plan: &StepPlan) -> Result<StepOutcome, BackendError>;
}

/// Token id the simulated backends report for every sampled token.
pub const SIM_TOKEN: u32 = 0;
