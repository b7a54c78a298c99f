//! Metrics, summaries and comparisons of serving-simulator runs.
//!
//! The crate turns the records a run emits ([`engine::record::RequestRecord`] for every
//! request, [`engine::record::StepRecord`] for every engine step, and the pooled
//! inter-token gaps) into the outputs of DESIGN §8:
//!
//! * `requests.csv` and `steps.csv`, streamed row by row while the run goes on
//!   ([`RunCollector::with_csv`]);
//! * a [`Summary`] with the metrics of DESIGN §4, named as vLLM's benchmark client
//!   (`benchmarks/benchmark_serving.py`) names them, written as `summary.json`
//!   ([`write_summary_json`]);
//! * a comparison of several variants of a scenario, as a terminal table
//!   ([`comparison_table`]) and as `comparison.csv` ([`write_comparison_csv`]).
//!
//! # Memory
//!
//! [`RunCollector`] is streaming: its memory does not grow with the number of requests or
//! steps (only with the number of classes and, logarithmically, the range of the
//! latencies). Request and step records are written out as they come and folded into
//! running counts and sums (token totals, first arrival, last finish, completed, rejected
//! and SLO-meeting requests, step averages). Each latency metric (TTFT, TPOT, E2EL,
//! queueing delay and inter-token latency overall, of which there can be 10^8 or more
//! gaps; TTFT, TPOT and E2EL per class) goes into an HDR histogram in nanoseconds with 3
//! significant digits, alongside exact integer sums for its mean and standard deviation. TPOT, the one fractional metric, is recorded rounded to the
//! nearest nanosecond (at most 0.5 ns off: a relative error below 5e-7 for a 1 ms TPOT).
//!
//! # Statistics
//!
//! Means and standard deviations (population, `ddof = 0`, as `numpy.std`) are exact (up to
//! the final `f64` rounding): they come from integer sums. Percentiles and medians are
//! interpolated between ranks with numpy's default linear method, which is what vLLM
//! reports, but the values at those ranks come from the histograms, so summary percentiles
//! have a relative error below 0.1 %. [`percentile`] and [`median`] compute exact values
//! of a slice, as `numpy.percentile` and `numpy.median` do. Metrics are computed over
//! completed (non-rejected) requests; an empty set of values gives 0, never NaN, so every
//! summary serialises to JSON.
//!
//! # Determinism
//!
//! Every output is a function of the records alone and is byte-for-byte reproducible:
//! times in the CSV files are printed from integer nanoseconds, other floats with a fixed
//! number of decimals.
#![warn(missing_docs)]

mod collector;
mod compare;
mod error;
pub mod fleet;
mod latency;
pub mod plots;
pub mod prometheus;
pub mod replicas;
pub mod report;
mod rows;
mod slo;
mod stats;
mod summary;

pub use collector::{RunCollector, RunInfo, DEFAULT_STORM_THRESHOLD};
pub use compare::{comparison_table, write_comparison_csv};
pub use error::AnalysisError;
pub use rows::{REQUESTS_CSV_HEADER, STEPS_CSV_HEADER};
pub use slo::Slo;
pub use stats::{median, percentile};
pub use summary::{
    read_summary_json, write_summary_json, ClassSummary, OffloadSummary, SpecSummary, Summary,
};
