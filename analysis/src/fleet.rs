//! Fleet outputs: one row per replica and per pool (`replicas.csv`, `pools.csv`) and the
//! fleet's own figures (`fleet.json`): GPUs, goodput per GPU, cost per million tokens,
//! how evenly the router spread the load.
//!
//! In: each member's [`Summary`] (a replica's or a pool's requests and steps, as a run's
//! collector computes them) plus what the records do not carry (GPUs, requests routed,
//! prices). Out: the rows and files; nothing here reads records.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::AnalysisError;
use crate::summary::Summary;

/// A replica or a pool, as `replicas.csv` and `pools.csv` list them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberRow {
    /// `<pool>-<i>` for a replica, the pool's name for a pool.
    pub name: String,
    /// The pool.
    pub pool: String,
    /// Replicas (1 for a replica).
    pub replicas: u32,
    /// GPUs.
    pub gpus: u32,
    /// Requests the router sent here.
    pub routed: u64,
    /// Requests finished.
    pub completed: u64,
    /// Requests rejected.
    pub rejected: u64,
    /// Requests per second over the member's own makespan.
    pub request_throughput: f64,
    /// Output tokens per second over the member's own makespan.
    pub output_throughput: f64,
    /// Mean TTFT (ms).
    pub mean_ttft_ms: f64,
    /// p99 TTFT (ms).
    pub p99_ttft_ms: f64,
    /// Mean TPOT (ms).
    pub mean_tpot_ms: f64,
    /// p99 TPOT (ms).
    pub p99_tpot_ms: f64,
    /// Prefix-cache hit rate in tokens.
    pub prefix_cache_hit_rate: f64,
    /// Mean KV usage over the member's steps.
    pub mean_kv_usage: f64,
    /// Steps run.
    pub num_steps: u64,
    /// Preemptions.
    pub num_preemptions: u64,
    /// Prefix-cache evictions.
    pub evictions: u64,
}

impl MemberRow {
    /// The row of a member named `name` in `pool` from its summary.
    pub fn of(
        name: &str,
        pool: &str,
        replicas: u32,
        gpus: u32,
        routed: u64,
        evictions: u64,
        s: &Summary,
    ) -> Self {
        MemberRow {
            name: name.into(),
            pool: pool.into(),
            replicas,
            gpus,
            routed,
            completed: s.completed,
            rejected: s.num_rejected,
            request_throughput: s.request_throughput,
            output_throughput: s.output_throughput,
            mean_ttft_ms: s.mean_ttft_ms,
            p99_ttft_ms: s.p99_ttft_ms,
            mean_tpot_ms: s.mean_tpot_ms,
            p99_tpot_ms: s.p99_tpot_ms,
            prefix_cache_hit_rate: s.prefix_cache_hit_rate,
            mean_kv_usage: s.mean_kv_usage,
            num_steps: s.num_steps,
            num_preemptions: s.num_preemptions,
            evictions,
        }
    }
}

/// `fleet.json`: the fleet as a whole.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetSummary {
    /// The router's policy.
    pub routing: String,
    /// How often the router's view was refreshed (ms; 0: every decision).
    pub refresh_ms: f64,
    /// Replicas.
    pub replicas: u32,
    /// GPUs.
    pub gpus: u32,
    /// Requests finished.
    pub completed: u64,
    /// Requests per second over the fleet's makespan.
    pub request_throughput: f64,
    /// Requests per second meeting every SLO (absent without an SLO).
    pub request_goodput: Option<f64>,
    /// Goodput per GPU (absent without an SLO).
    pub request_goodput_per_gpu: Option<f64>,
    /// Requests per second per GPU.
    pub request_throughput_per_gpu: f64,
    /// Output tokens per second per GPU.
    pub output_throughput_per_gpu: f64,
    /// The fleet's price per hour (absent unless every pool has a price).
    pub usd_per_hour: Option<f64>,
    /// Dollars per million output tokens at the measured throughput.
    pub usd_per_million_output_tokens: Option<f64>,
    /// Dollars per million prompt + output tokens.
    pub usd_per_million_tokens: Option<f64>,
    /// Most requests sent to one replica over the mean of its pool, the largest over the
    /// pools (1: perfectly even; pools are compared within, as prefill and decode replicas
    /// see different counts).
    pub routing_imbalance: f64,
    /// Prefix-cache hit rate over the fleet.
    pub prefix_cache_hit_rate: f64,
    /// Prefill/decode disaggregation: prompts whose KV moved to a decode replica.
    pub kv_transfers: u64,
    /// Their mean transfer time (ms).
    pub mean_kv_transfer_ms: f64,
    /// The longest (ms).
    pub max_kv_transfer_ms: f64,
    /// Of the mean transfer time, the wait for the prefill replica's and the decode
    /// replica's links (ms): transfers that meet on a link go one after another.
    #[serde(default)]
    pub mean_kv_link_wait_ms: f64,
    /// GB moved per GPU link, summed over transfers.
    pub kv_transfer_gb: f64,
    /// The pools.
    pub pools: Vec<MemberRow>,
}

impl FleetSummary {
    /// The fleet's figures from its summary (`s`), pools, replicas and price per hour.
    pub fn of(
        routing: &str,
        refresh_ms: f64,
        s: &Summary,
        pools: Vec<MemberRow>,
        replicas: &[MemberRow],
        usd_per_hour: Option<f64>,
    ) -> Self {
        let gpus: u32 = pools.iter().map(|p| p.gpus).sum();
        let g = f64::from(gpus.max(1));
        let imbalance = pools
            .iter()
            .filter_map(|p| {
                let of: Vec<u64> = replicas
                    .iter()
                    .filter(|r| r.pool == p.name)
                    .map(|r| r.routed)
                    .collect();
                let sum: u64 = of.iter().sum();
                let most = of.iter().copied().max()?;
                (sum > 0).then(|| most as f64 / (sum as f64 / of.len() as f64))
            })
            .fold(1.0f64, f64::max);
        let per_million = |tokens_per_s: f64| {
            usd_per_hour
                .filter(|_| tokens_per_s > 0.0)
                .map(|usd| usd / 3600.0 / tokens_per_s * 1e6)
        };
        FleetSummary {
            routing: routing.into(),
            refresh_ms,
            replicas: replicas.len() as u32,
            gpus,
            completed: s.completed,
            request_throughput: s.request_throughput,
            request_goodput: s.request_goodput,
            request_goodput_per_gpu: s.request_goodput.map(|x| x / g),
            request_throughput_per_gpu: s.request_throughput / g,
            output_throughput_per_gpu: s.output_throughput / g,
            usd_per_hour,
            usd_per_million_output_tokens: per_million(s.output_throughput),
            usd_per_million_tokens: per_million(s.total_token_throughput),
            routing_imbalance: imbalance,
            prefix_cache_hit_rate: s.prefix_cache_hit_rate,
            kv_transfers: 0,
            mean_kv_transfer_ms: 0.0,
            max_kv_transfer_ms: 0.0,
            mean_kv_link_wait_ms: 0.0,
            kv_transfer_gb: 0.0,
            pools,
        }
    }
}

/// Writes `rows` as CSV.
pub fn write_members_csv(path: &Path, rows: &[MemberRow]) -> Result<(), AnalysisError> {
    let file = File::create(path).map_err(|e| AnalysisError::io(path, e))?;
    let mut w = csv::Writer::from_writer(BufWriter::new(file));
    for r in rows {
        w.serialize(r).map_err(|e| AnalysisError::csv(path, e))?;
    }
    w.flush().map_err(|e| AnalysisError::io(path, e))
}

/// Writes `fleet.json`.
pub fn write_fleet_json(path: &Path, f: &FleetSummary) -> Result<(), AnalysisError> {
    let file = File::create(path).map_err(|e| AnalysisError::io(path, e))?;
    let mut w = BufWriter::new(file);
    serde_json::to_writer_pretty(&mut w, f).map_err(|source| AnalysisError::Json {
        path: path.into(),
        source,
    })?;
    writeln!(w).map_err(|e| AnalysisError::io(path, e))?;
    w.flush().map_err(|e| AnalysisError::io(path, e))
}

/// Reads `fleet.json`.
pub fn read_fleet_json(path: &Path) -> Result<FleetSummary, AnalysisError> {
    let text = std::fs::read_to_string(path).map_err(|e| AnalysisError::io(path, e))?;
    serde_json::from_str(&text).map_err(|source| AnalysisError::Json {
        path: path.into(),
        source,
    })
}
