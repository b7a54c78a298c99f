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
//! [`RunCollector`] is streaming: step records are folded into running sums and written
//! out, so its memory does not grow with the number of steps. It keeps a few numbers per
//! request (for exact percentiles of TTFT, TPOT, E2EL and queueing delay). Inter-token
//! latencies, of which there can be 10^8 or more, go into an HDR histogram (nanoseconds,
//! 3 significant digits) alongside exact integer sums for their mean and standard
//! deviation.
//!
//! # Statistics
//!
//! Means and standard deviations (population, `ddof = 0`, as `numpy.std`) come from
//! [`statrs`]; percentiles use numpy's default linear interpolation ([`percentile`]) and
//! medians follow `numpy.median` ([`median`]), which is what vLLM reports. Metrics are
//! computed over completed (non-rejected) requests; an empty set of values gives 0, never
//! NaN, so every summary serialises to JSON.
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
mod itl;
mod rows;
mod slo;
mod stats;
mod summary;

pub use collector::{RunCollector, RunInfo};
pub use compare::{comparison_table, write_comparison_csv};
pub use error::AnalysisError;
pub use rows::{REQUESTS_CSV_HEADER, STEPS_CSV_HEADER};
pub use slo::Slo;
pub use stats::{median, percentile};
pub use summary::{read_summary_json, write_summary_json, ClassSummary, Summary};
