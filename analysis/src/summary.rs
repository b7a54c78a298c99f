//! The summary of one run and `summary.json`.

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::AnalysisError;
use crate::slo::Slo;
use crate::stats::MetricStats;

/// Metrics of one request class (completed requests only, latencies in ms).
///
fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// As in [`Summary`], means are exact and medians and 99th percentiles come from HDR
/// histograms (relative error below 0.1 %).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ClassSummary {
    /// Class name.
    pub name: String,
    /// Completed (non-rejected) requests.
    pub completed: u64,
    /// Rejected requests.
    pub rejected: u64,
    /// Mean time to first token (ms, exact).
    pub mean_ttft_ms: f64,
    /// Median time to first token (ms; HDR histogram, < 0.1 % relative error).
    pub median_ttft_ms: f64,
    /// 99th percentile of time to first token (ms; HDR histogram, < 0.1 % relative error).
    pub p99_ttft_ms: f64,
    /// Mean time per output token (ms, exact).
    pub mean_tpot_ms: f64,
    /// Median time per output token (ms; HDR histogram, < 0.1 % relative error).
    pub median_tpot_ms: f64,
    /// 99th percentile of time per output token (ms; HDR histogram, < 0.1 % relative error).
    pub p99_tpot_ms: f64,
    /// Mean end-to-end latency (ms, exact).
    pub mean_e2el_ms: f64,
    /// Median end-to-end latency (ms; HDR histogram, < 0.1 % relative error).
    pub median_e2el_ms: f64,
    /// 99th percentile of end-to-end latency (ms; HDR histogram, < 0.1 % relative error).
    pub p99_e2el_ms: f64,
    /// The class's speculative-decoding acceptance (absent without verify steps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculative: Option<SpecSummary>,
}

/// Speculative decoding's acceptance over a run or a class (DESIGN §4; vLLM V1's metric
/// definitions, and SGLang's accept length).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct SpecSummary {
    /// Verify steps with drafts (vLLM's `num_drafts`).
    pub num_drafts: u64,
    /// Draft tokens verified.
    pub num_draft_tokens: u64,
    /// Draft tokens accepted.
    pub num_accepted_tokens: u64,
    /// Accepted / drafted tokens (the bonus token excluded).
    pub acceptance_rate: f64,
    /// `1 + accepted / drafts` (vLLM).
    pub mean_acceptance_length: f64,
    /// Tokens emitted per verify step, the target's own token included (SGLang's
    /// `accept_length`; below the mean acceptance length only where a request's end cut
    /// a step short).
    pub accept_length: f64,
    /// Accepted at draft position i / drafts (non-increasing).
    pub acceptance_per_position: Vec<f64>,
}

impl SpecSummary {
    /// The summary of `s` (`None` without verify steps).
    pub fn of(s: &engine::spec::SpecStats) -> Option<SpecSummary> {
        (s.num_drafts > 0).then(|| SpecSummary {
            num_drafts: s.num_drafts,
            num_draft_tokens: s.num_draft_tokens,
            num_accepted_tokens: s.num_accepted_tokens,
            acceptance_rate: s.acceptance_rate(),
            mean_acceptance_length: s.mean_acceptance_length(),
            accept_length: s.accept_length(),
            acceptance_per_position: s.per_position(),
        })
    }
}

impl ClassSummary {
    /// A class summary from its counts and metric statistics.
    pub(crate) fn new(
        name: String,
        completed: u64,
        rejected: u64,
        ttft: MetricStats,
        tpot: MetricStats,
        e2el: MetricStats,
    ) -> Self {
        ClassSummary {
            name,
            completed,
            rejected,
            mean_ttft_ms: ttft.mean,
            median_ttft_ms: ttft.median,
            p99_ttft_ms: ttft.p99,
            mean_tpot_ms: tpot.mean,
            median_tpot_ms: tpot.median,
            p99_tpot_ms: tpot.p99,
            mean_e2el_ms: e2el.mean,
            median_e2el_ms: e2el.median,
            p99_e2el_ms: e2el.p99,
            speculative: None,
        }
    }
}

/// Everything reported about one run (`summary.json`).
///
/// Field names follow vLLM's benchmark client (`benchmarks/benchmark_serving.py`). Latency
/// metrics are over completed (non-rejected) requests, in milliseconds; TPOT leaves out
/// requests with at most one output token; ITL pools every gap between consecutive tokens.
/// Empty sets give 0.
///
/// Means and standard deviations (population, as `numpy.std`) are exact, computed from
/// integer sums of nanoseconds. Medians and the 90th, 95th and 99th percentiles are
/// interpolated between ranks as `numpy.percentile` does, with the values at those ranks
/// taken from HDR histograms of nanoseconds with 3 significant digits: their relative
/// error is below 0.1 %. TPOT values enter rounded to the nearest nanosecond.
///
/// `Summary::default()` is the summary of nothing: empty names and zeros.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct Summary {
    /// Scenario name.
    pub scenario: String,
    /// Variant name.
    pub variant: String,
    /// Backend name.
    pub backend: String,
    /// Completed (non-rejected) requests.
    pub completed: u64,
    /// Rejected requests.
    pub num_rejected: u64,
    /// Requests their clients aborted (a served run's hang-ups, or its shutdown), left out
    /// of every other figure.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub num_aborted: u64,
    /// Prompt tokens of completed requests.
    pub total_input_tokens: u64,
    /// Prefix-cache hit rate in tokens: prompt tokens served from the cache / prompt tokens
    /// (completed requests, first admission).
    pub prefix_cache_hit_rate: f64,
    /// Output tokens of completed requests.
    pub total_output_tokens: u64,
    /// Makespan (s): last finish minus first arrival, over all requests including rejected.
    pub duration: f64,
    /// Completed requests per second.
    pub request_throughput: f64,
    /// Output tokens per second.
    pub output_throughput: f64,
    /// Prompt plus output tokens per second.
    pub total_token_throughput: f64,
    /// Completed requests per second that meet every given SLO; `None` without an SLO.
    pub request_goodput: Option<f64>,
    /// The SLO goodput was measured against.
    pub slo: Slo,

    /// Mean time to first token (ms, exact).
    pub mean_ttft_ms: f64,
    /// Median time to first token (ms; HDR histogram, < 0.1 % relative error).
    pub median_ttft_ms: f64,
    /// Standard deviation of time to first token (ms, exact).
    pub std_ttft_ms: f64,
    /// 90th percentile of time to first token (ms; HDR histogram, < 0.1 % relative error).
    pub p90_ttft_ms: f64,
    /// 95th percentile of time to first token (ms; HDR histogram, < 0.1 % relative error).
    pub p95_ttft_ms: f64,
    /// 99th percentile of time to first token (ms; HDR histogram, < 0.1 % relative error).
    pub p99_ttft_ms: f64,

    /// Mean time per output token (ms, exact).
    pub mean_tpot_ms: f64,
    /// Median time per output token (ms; HDR histogram, < 0.1 % relative error).
    pub median_tpot_ms: f64,
    /// Standard deviation of time per output token (ms, exact).
    pub std_tpot_ms: f64,
    /// 90th percentile of time per output token (ms; HDR histogram, < 0.1 % relative error).
    pub p90_tpot_ms: f64,
    /// 95th percentile of time per output token (ms; HDR histogram, < 0.1 % relative error).
    pub p95_tpot_ms: f64,
    /// 99th percentile of time per output token (ms; HDR histogram, < 0.1 % relative error).
    pub p99_tpot_ms: f64,

    /// Mean inter-token latency (ms, exact).
    pub mean_itl_ms: f64,
    /// Median inter-token latency (ms; HDR histogram, < 0.1 % relative error).
    pub median_itl_ms: f64,
    /// Standard deviation of inter-token latency (ms, exact).
    pub std_itl_ms: f64,
    /// 90th percentile of inter-token latency (ms; HDR histogram, < 0.1 % relative error).
    pub p90_itl_ms: f64,
    /// 95th percentile of inter-token latency (ms; HDR histogram, < 0.1 % relative error).
    pub p95_itl_ms: f64,
    /// 99th percentile of inter-token latency (ms; HDR histogram, < 0.1 % relative error).
    pub p99_itl_ms: f64,

    /// Mean end-to-end latency (ms, exact).
    pub mean_e2el_ms: f64,
    /// Median end-to-end latency (ms; HDR histogram, < 0.1 % relative error).
    pub median_e2el_ms: f64,
    /// Standard deviation of end-to-end latency (ms, exact).
    pub std_e2el_ms: f64,
    /// 90th percentile of end-to-end latency (ms; HDR histogram, < 0.1 % relative error).
    pub p90_e2el_ms: f64,
    /// 95th percentile of end-to-end latency (ms; HDR histogram, < 0.1 % relative error).
    pub p95_e2el_ms: f64,
    /// 99th percentile of end-to-end latency (ms; HDR histogram, < 0.1 % relative error).
    pub p99_e2el_ms: f64,

    /// Mean queueing delay, first scheduled minus arrival (ms, exact).
    pub mean_queue_ms: f64,
    /// Median queueing delay (ms; HDR histogram, < 0.1 % relative error).
    pub median_queue_ms: f64,
    /// Standard deviation of queueing delay (ms, exact).
    pub std_queue_ms: f64,
    /// 90th percentile of queueing delay (ms; HDR histogram, < 0.1 % relative error).
    pub p90_queue_ms: f64,
    /// 95th percentile of queueing delay (ms; HDR histogram, < 0.1 % relative error).
    pub p95_queue_ms: f64,
    /// 99th percentile of queueing delay (ms; HDR histogram, < 0.1 % relative error).
    pub p99_queue_ms: f64,

    /// Engine steps.
    pub num_steps: u64,
    /// Preemptions (sum of the steps' `num_preempted`).
    pub num_preemptions: u64,
    /// Most preemptions of any single request (a preemption storm shows here).
    pub max_request_preemptions: u32,
    /// Preemptions that swapped the victim's KV to the CPU pool.
    pub num_swap_preemptions: u64,
    /// Preemptions that dropped the victim's KV (to be recomputed).
    pub num_recompute_preemptions: u64,
    /// Requests preempted more than `preemption_storm_threshold` times (DESIGN §3
    /// invariant 9: a storm is detected and reported).
    pub num_preemption_storms: u64,
    /// The storm threshold the run used.
    pub preemption_storm_threshold: u32,
    /// Blocks swapped out to the CPU pool.
    pub swap_out_blocks: u64,
    /// Blocks swapped back in from the CPU pool.
    pub swap_in_blocks: u64,
    /// Tokens computed again after recompute preemptions dropped their KV.
    pub recomputed_tokens: u64,
    /// Copy-on-write block copies.
    pub block_copies: u64,
    /// Mean sequences per step.
    pub mean_batch_size: f64,
    /// Mean batched tokens per step.
    pub mean_batched_tokens: f64,
    /// Mean KV usage over steps (fraction of the pool).
    pub mean_kv_usage: f64,
    /// Reserved but unused KV: 1 - tokens held / slots of the blocks in use, over all
    /// steps (0 when blocks are shared by the prefix cache and hold more than that).
    pub kv_fragmentation: f64,
    /// Mean over steps of `1 - longest free run / free blocks`: free KV that a contiguous
    /// allocator cannot use for a long request (0 for the paged allocator).
    pub kv_external_fragmentation: f64,
    /// Maximum KV usage over steps (fraction of the pool).
    pub max_kv_usage: f64,
    /// KV pool size in blocks.
    pub kv_pool_blocks: u32,
    /// KV blocks still in use when the run ended (should be 0).
    pub leaked_blocks: u32,
    /// Cached KV blocks evicted from the prefix cache.
    pub num_evictions: u64,
    /// Wall-clock time of the simulation (s). Not serialised: `summary.json` and
    /// `comparison.csv` must be byte-identical for the same scenario and seed.
    #[serde(skip_serializing, default)]
    pub wall_time_s: f64,
    /// Simulated requests (completed and rejected) per wall-clock second (not serialised).
    #[serde(skip_serializing, default)]
    pub sim_speed: f64,
    /// Speculative decoding's acceptance (absent without verify steps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculative: Option<SpecSummary>,
    /// The CPU offload tier under the prefix cache (absent without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offload: Option<OffloadSummary>,
    /// Per-class metrics, in class-index order.
    pub classes: Vec<ClassSummary>,
}

/// The CPU offload tier's figures: its counters and the prefix-cache hit rate by tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct OffloadSummary {
    /// Capacity, blocks.
    pub capacity_blocks: u32,
    /// Blocks held when the run ended.
    pub blocks_at_end: u32,
    /// Blocks written to the tier.
    pub stores: u64,
    /// Blocks loaded back (hits in the tier).
    pub loads: u64,
    /// Blocks dropped because it was full.
    pub evictions: u64,
    /// Prompt tokens found in the GPU prefix cache / prompt tokens: the hit rate less the
    /// tier's part (at least 0).
    pub gpu_hit_rate: f64,
    /// Prompt tokens loaded from the tier / prompt tokens. Every load counts, a request
    /// readmitted after a preemption included, so under preemption this overstates the
    /// tier's share of first admissions' hits.
    pub cpu_hit_rate: f64,
    /// The disk tier under it (absent without one); its hit rate is not in the two above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<DiskTierSummary>,
}

/// The disk tier's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct DiskTierSummary {
    /// Capacity, blocks.
    pub capacity_blocks: u32,
    /// Blocks held when the run ended.
    pub blocks_at_end: u32,
    /// Blocks written to it (the CPU tier's victims).
    pub stores: u64,
    /// Blocks loaded back from it (hits there).
    pub loads: u64,
    /// Blocks dropped because it was full.
    pub evictions: u64,
    /// Prompt tokens loaded from disk / prompt tokens.
    pub hit_rate: f64,
}

impl Summary {
    /// The scalar fields (everything but `slo` and `classes`) as `(name, value)` pairs, in
    /// field order; floats with 6 decimals, a missing goodput as an empty string.
    pub fn scalar_fields(&self) -> Vec<(String, String)> {
        let f = |x: f64| format!("{x:.6}");
        let v: Vec<(&str, String)> = vec![
            ("scenario", self.scenario.clone()),
            ("variant", self.variant.clone()),
            ("backend", self.backend.clone()),
            ("completed", self.completed.to_string()),
            ("num_rejected", self.num_rejected.to_string()),
            ("total_input_tokens", self.total_input_tokens.to_string()),
            ("prefix_cache_hit_rate", f(self.prefix_cache_hit_rate)),
            ("total_output_tokens", self.total_output_tokens.to_string()),
            ("duration", f(self.duration)),
            ("request_throughput", f(self.request_throughput)),
            ("output_throughput", f(self.output_throughput)),
            ("total_token_throughput", f(self.total_token_throughput)),
            (
                "request_goodput",
                self.request_goodput.map(f).unwrap_or_default(),
            ),
        ];
        let metrics: [(&'static str, [f64; 6]); 5] = [
            (
                "ttft",
                [
                    self.mean_ttft_ms,
                    self.median_ttft_ms,
                    self.std_ttft_ms,
                    self.p90_ttft_ms,
                    self.p95_ttft_ms,
                    self.p99_ttft_ms,
                ],
            ),
            (
                "tpot",
                [
                    self.mean_tpot_ms,
                    self.median_tpot_ms,
                    self.std_tpot_ms,
                    self.p90_tpot_ms,
                    self.p95_tpot_ms,
                    self.p99_tpot_ms,
                ],
            ),
            (
                "itl",
                [
                    self.mean_itl_ms,
                    self.median_itl_ms,
                    self.std_itl_ms,
                    self.p90_itl_ms,
                    self.p95_itl_ms,
                    self.p99_itl_ms,
                ],
            ),
            (
                "e2el",
                [
                    self.mean_e2el_ms,
                    self.median_e2el_ms,
                    self.std_e2el_ms,
                    self.p90_e2el_ms,
                    self.p95_e2el_ms,
                    self.p99_e2el_ms,
                ],
            ),
            (
                "queue",
                [
                    self.mean_queue_ms,
                    self.median_queue_ms,
                    self.std_queue_ms,
                    self.p90_queue_ms,
                    self.p95_queue_ms,
                    self.p99_queue_ms,
                ],
            ),
        ];
        let mut out: Vec<(String, String)> =
            v.into_iter().map(|(k, x)| (k.to_owned(), x)).collect();
        for (metric, values) in metrics {
            for (stat, value) in METRIC_STATS.iter().zip(values) {
                out.push((format!("{stat}_{metric}_ms"), f(value)));
            }
        }
        let tail: [(&str, String); 20] = [
            ("num_steps", self.num_steps.to_string()),
            ("num_preemptions", self.num_preemptions.to_string()),
            (
                "max_request_preemptions",
                self.max_request_preemptions.to_string(),
            ),
            (
                "num_swap_preemptions",
                self.num_swap_preemptions.to_string(),
            ),
            (
                "num_recompute_preemptions",
                self.num_recompute_preemptions.to_string(),
            ),
            (
                "num_preemption_storms",
                self.num_preemption_storms.to_string(),
            ),
            (
                "preemption_storm_threshold",
                self.preemption_storm_threshold.to_string(),
            ),
            ("swap_out_blocks", self.swap_out_blocks.to_string()),
            ("swap_in_blocks", self.swap_in_blocks.to_string()),
            ("recomputed_tokens", self.recomputed_tokens.to_string()),
            ("block_copies", self.block_copies.to_string()),
            ("mean_batch_size", f(self.mean_batch_size)),
            ("mean_batched_tokens", f(self.mean_batched_tokens)),
            ("mean_kv_usage", f(self.mean_kv_usage)),
            ("kv_fragmentation", f(self.kv_fragmentation)),
            (
                "kv_external_fragmentation",
                f(self.kv_external_fragmentation),
            ),
            ("max_kv_usage", f(self.max_kv_usage)),
            ("kv_pool_blocks", self.kv_pool_blocks.to_string()),
            ("leaked_blocks", self.leaked_blocks.to_string()),
            ("num_evictions", self.num_evictions.to_string()),
        ];
        out.extend(tail.into_iter().map(|(k, x)| (k.to_owned(), x)));
        // Speculative decoding (zeros without it, so every row has the same columns).
        let sp = self.speculative.clone().unwrap_or_default();
        out.extend([
            ("spec_num_drafts".to_owned(), sp.num_drafts.to_string()),
            (
                "spec_num_draft_tokens".to_owned(),
                sp.num_draft_tokens.to_string(),
            ),
            (
                "spec_num_accepted_tokens".to_owned(),
                sp.num_accepted_tokens.to_string(),
            ),
            ("spec_acceptance_rate".to_owned(), f(sp.acceptance_rate)),
            (
                "spec_mean_acceptance_length".to_owned(),
                f(sp.mean_acceptance_length),
            ),
            ("spec_accept_length".to_owned(), f(sp.accept_length)),
        ]);
        out
    }
}

/// The six statistics reported for each latency metric, in field order.
const METRIC_STATS: [&str; 6] = ["mean", "median", "std", "p90", "p95", "p99"];

/// Writes `s` as pretty-printed JSON (with a final newline) to `path`, creating the parent
/// directory if needed.
pub fn write_summary_json(path: &Path, s: &Summary) -> Result<(), AnalysisError> {
    create_parent(path)?;
    let file = File::create(path).map_err(|e| AnalysisError::io(path, e))?;
    let mut w = BufWriter::new(file);
    serde_json::to_writer_pretty(&mut w, s).map_err(|source| AnalysisError::Json {
        path: path.to_path_buf(),
        source,
    })?;
    w.write_all(b"\n").map_err(|e| AnalysisError::io(path, e))?;
    w.flush().map_err(|e| AnalysisError::io(path, e))
}

/// Reads a summary written by [`write_summary_json`].
pub fn read_summary_json(path: &Path) -> Result<Summary, AnalysisError> {
    let file = File::open(path).map_err(|e| AnalysisError::io(path, e))?;
    serde_json::from_reader(BufReader::new(file)).map_err(|source| AnalysisError::Json {
        path: path.to_path_buf(),
        source,
    })
}

/// Creates the parent directory of `path` when it has one that does not exist.
pub(crate) fn create_parent(path: &Path) -> Result<(), AnalysisError> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => {
            std::fs::create_dir_all(dir).map_err(|e| AnalysisError::io(dir, e))
        }
        _ => Ok(()),
    }
}
