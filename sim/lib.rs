//! `sim`: an actor-based discrete-event simulator of LLM inference serving.
//!
//! A scenario file ([`scenario`]) names a model on GPUs (from the [`catalog`] or files), the
//! engine's knobs and a workload ([`workload`]); each `[[variant]]` changes some knobs. For
//! every variant the driver ([`driver`]) replays the same request stream through the
//! engine's scheduler, block manager and worker actors, with the cost model ([`cost_model`])
//! predicting each step's duration (or a real runtime of `kernels` measuring it); [`run`]
//! writes per-request and per-step CSVs, a `summary.json` per variant and a comparison
//! across variants. [`sweep`] crosses variants with swept keys, [`plan`] searches the
//! highest rate a deployment sustains, [`speculate`] measures speculative decoding on a
//! real model. The command line (`sim/main.rs`, `sim/commands/`) is a thin layer on these.
//!
//! ```no_run
//! use sim::run::{run_scenario, RunOptions};
//! use sim::scenario::Scenario;
//!
//! let scenario = Scenario::load("scenarios/mixed.toml".as_ref(), None).unwrap();
//! let results = run_scenario(&scenario, &RunOptions::default()).unwrap();
//! for r in &results {
//!     println!("{}: {:.1} req/s", r.summary.variant, r.summary.request_throughput);
//! }
//! ```
#![warn(missing_docs)]

pub mod bands;
pub mod catalog;
pub mod claims;
pub mod cost_model;
pub mod driver;
pub mod messages;
pub mod observed;
pub mod plan;
pub mod replay;
pub mod router;
pub mod run;
pub mod scenario;
pub mod serve;
pub mod speculate;
pub mod sweep;
pub mod workload;

/// Errors of the simulator library (the binary turns them into one line and exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A scenario file problem.
    #[error(transparent)]
    Scenario(#[from] scenario::ScenarioError),
    /// A workload or trace problem.
    #[error(transparent)]
    Workload(#[from] workload::WorkloadError),
    /// A run failed.
    #[error("variant `{variant}`: {source}")]
    Run {
        /// The variant.
        variant: String,
        /// What failed (boxed: driver errors are large).
        source: Box<driver::DriverError>,
    },
    /// Writing results failed.
    #[error(transparent)]
    Analysis(#[from] analysis::AnalysisError),
    /// `sim serve` could not start or stopped badly.
    #[error("{0}")]
    Serve(String),
    /// A file could not be written.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The error.
        source: std::io::Error,
    },
}
