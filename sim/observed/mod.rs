//! Runs of real engines, read into one shape ([`ObservedRun`]) for `sim replay` and
//! `sim calibrate --observed`: each request as the engine saw it (when it was sent, its
//! prompt and output lengths, the measured TTFT and end-to-end latency) and what the files
//! say about the deployment (model, engine arguments, the KV blocks the engine allocated).
//!
//! One file per format, each a small reader:
//! - `llmservingsim.rs`: a run directory of LLMServingSim's vLLM harness (`vllm/meta.json`,
//!   `vllm/requests.jsonl` with engine-side timestamps);
//! - `vllm_bench.rs`: `vllm bench serve --save-result --save-detailed` JSON;
//! - `aiperf.rs`: NVIDIA aiperf's per-request export (`profile_export.jsonl`, with the run's
//!   settings from `profile_export_aiperf.json` beside it);
//! - `blis.rs`: a BLIS / inference-sim TraceV2 CSV;
//! - `plain_csv.rs`: a documented CSV for any other engine;
//! - `sim_run.rs`: a folder `sim serve` (or `sim run`) wrote: its `requests.csv` and
//!   `plan.json`;
//! - `silicon.rs`: closed-loop aggregate rows (aiconfigurator's `silicon.csv`: mean TTFT and
//!   TPOT of a closed loop's clients at fixed lengths), which are not per-request runs.
//!
//! Readers of other tools' files ignore keys they do not use (those tools add keys between
//! versions); every field they use is checked, and an error names the file, the line and the
//! field.

mod aiperf;
mod blis;
mod llmservingsim;
pub mod operator_profile;
mod plain_csv;
pub mod silicon;
pub mod sim_run;
mod vllm_bench;

use std::path::{Path, PathBuf};

/// What can go wrong reading a run: one line naming the file, line and field.
#[derive(Debug, thiserror::Error)]
#[error("{}{}{}: {message}", path.display(), line.map(|l| format!(":{l}")).unwrap_or_default(), field.as_ref().map(|f| format!(": {f}")).unwrap_or_default())]
pub struct ObservedError {
    /// The file.
    pub path: PathBuf,
    /// 1-based line (JSON lines, CSV rows), when the problem is in one.
    pub line: Option<u64>,
    /// The field or column.
    pub field: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl ObservedError {
    pub(crate) fn new(path: &Path, message: impl Into<String>) -> Self {
        ObservedError {
            path: path.to_path_buf(),
            line: None,
            field: None,
            message: message.into(),
        }
    }

    pub(crate) fn at(
        path: &Path,
        line: Option<u64>,
        field: &str,
        message: impl Into<String>,
    ) -> Self {
        ObservedError {
            path: path.to_path_buf(),
            line,
            field: Some(field.to_string()),
            message: message.into(),
        }
    }
}

/// Reads and parses a JSON file; errors name the file and, for bad JSON, its line.
pub(crate) fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, ObservedError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ObservedError::new(path, format!("cannot read: {e}")))?;
    serde_json::from_str(&text).map_err(|e| {
        ObservedError::at(
            path,
            Some(e.line() as u64),
            "json",
            crate::messages::concise(&e.to_string()),
        )
    })
}

/// Each non-blank line of the JSON-lines file `path` parsed as a `T` and handed to `each`
/// with its 1-based line number. An unreadable file or line, a line that is not a `T`, or
/// more than [`MAX_REQUESTS`] records is one error naming the file and the line.
pub(crate) fn for_json_lines<T: serde::de::DeserializeOwned>(
    path: &Path,
    mut each: impl FnMut(u64, T) -> Result<(), ObservedError>,
) -> Result<(), ObservedError> {
    use std::io::BufRead;
    let file = std::fs::File::open(path)
        .map_err(|e| ObservedError::new(path, format!("cannot read: {e}")))?;
    let mut records = 0usize;
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let n = i as u64 + 1;
        let line = line
            .map_err(|e| ObservedError::at(path, Some(n), "line", format!("cannot read: {e}")))?;
        if line.trim().is_empty() {
            continue;
        }
        records += 1;
        if records > MAX_REQUESTS {
            return Err(ObservedError::at(
                path,
                Some(n),
                "line",
                format!("more than {MAX_REQUESTS} requests"),
            ));
        }
        let record: T = serde_json::from_str(&line).map_err(|e| {
            ObservedError::at(
                path,
                Some(n),
                "json",
                crate::messages::concise(&e.to_string()),
            )
        })?;
        each(n, record)?;
    }
    Ok(())
}

/// Checks that each field given (`(name, value)`) is a positive, finite number.
pub(crate) fn check_positive(
    path: &Path,
    fields: &[(&str, Option<f64>)],
) -> Result<(), ObservedError> {
    for &(field, v) in fields {
        if let Some(x) = v.filter(|x| !(x.is_finite() && *x > 0.0)) {
            return Err(ObservedError::at(
                path,
                None,
                field,
                format!("must be a positive number, got {x}"),
            ));
        }
    }
    Ok(())
}

/// One request of a real run, as the engine (or the benchmark client) measured it.
#[derive(Debug, Clone, PartialEq)]
pub struct ObservedRequest {
    /// The run's name for it.
    pub id: String,
    /// When it was sent (reached the engine), seconds after the run's first request; `None`
    /// when the file does not say (a vLLM bench result before vLLM 0.15).
    pub send_s: Option<f64>,
    /// Prompt tokens.
    pub prompt_len: u32,
    /// Output tokens generated.
    pub output_len: u32,
    /// Prompt token ids, when the run ships them (for the prefix cache).
    pub prompt_tokens: Vec<u32>,
    /// Which prompt of the client's dataset it sent, when the run records it (aiperf's
    /// `conversation_id`): requests with the same key sent the same prompt, which a prefix
    /// cache can serve again.
    pub prompt_key: Option<u64>,
    /// False when the request failed (its latencies are then `None`).
    pub ok: bool,
    /// Time to first token (ms).
    pub ttft_ms: Option<f64>,
    /// End-to-end latency, send to last token (ms).
    pub e2el_ms: Option<f64>,
    /// Engine-side queueing delay, arrival to first scheduled (ms), when measured.
    pub queue_ms: Option<f64>,
}

impl ObservedRequest {
    /// Time per output token after the first (ms): `(E2EL - TTFT) / (output - 1)`.
    pub fn tpot_ms(&self) -> Option<f64> {
        let (t, e) = (self.ttft_ms?, self.e2el_ms?);
        (self.output_len > 1).then(|| (e - t) / f64::from(self.output_len - 1))
    }
}

/// The deployment a run was measured on, as far as its files say.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ObservedEngine {
    /// Engine name (`vllm`, `sglang`, `trtllm`, ...).
    pub engine: Option<String>,
    /// Engine version.
    pub version: Option<String>,
    /// Model name as the engine was given it (a Hugging Face id).
    pub model: Option<String>,
    /// The model's `config.json`, when the run ships it.
    pub model_config: Option<PathBuf>,
    /// GPU name as the run reports it (e.g. `NVIDIA GeForce RTX 4090`, `RTXPRO6000`).
    pub gpu: Option<String>,
    /// Tensor parallelism.
    pub tp: Option<u32>,
    /// Data parallel replicas.
    pub dp: Option<u32>,
    /// Expert parallelism enabled.
    pub expert_parallel: bool,
    /// `max_num_seqs`.
    pub max_num_seqs: Option<u32>,
    /// `max_num_batched_tokens`.
    pub max_num_batched_tokens: Option<u32>,
    /// `max_model_len`.
    pub max_model_len: Option<u32>,
    /// Weights' dtype (`bfloat16`, ...).
    pub dtype: Option<String>,
    /// KV blocks the engine allocated on each GPU (vLLM's `num_gpu_blocks`).
    pub num_gpu_blocks: Option<u32>,
    /// KV block size (tokens).
    pub block_size: Option<u32>,
    /// `gpu_memory_utilization`.
    pub gpu_memory_utilization: Option<f64>,
    /// Prefix caching on.
    pub prefix_caching: Option<bool>,
    /// The benchmark client's cap on requests in flight.
    pub max_concurrency: Option<u32>,
    /// The offered request rate (req/s; `None`: all at once or unknown).
    pub request_rate: Option<f64>,
    /// The client sent every request at once (vLLM bench's request rate `inf`).
    pub all_at_once: bool,
    /// The client was a saturated closed loop of `max_concurrency` clients (each sending
    /// its next request as its last ended): replayed so, not at the recorded send times.
    pub closed_loop: bool,
    /// A served closed loop's turnaround: the median time from the end of the step that
    /// ended a request to the refill it let through reaching the engine (s, at least 0;
    /// from `steps.csv`). Replayed as the client's think time: a refill that came after the
    /// next step had started waits for that step in the replay too.
    pub refill_gap_s: Option<f64>,
    /// The client's burstiness (the shape of its gamma inter-arrival times; 1: Poisson).
    pub burstiness: Option<f64>,
    /// The benchmark's measured duration (s), first send to last response.
    pub duration_s: Option<f64>,
    /// The engine's scheduler (`sim` runs: `continuous`, `chunked`, ...; `None`: vLLM's
    /// chunked prefill).
    pub scheduler: Option<String>,
    /// Whether prompts were split into chunks (`enable_chunked_prefill`; `None`: not
    /// recorded, vLLM's default, on).
    pub chunked_prefill: Option<bool>,
    /// The bandwidth of the link between the GPUs, GB/s per direction, as the run's
    /// hardware description gives it (LLMServingSim's `config.json` `link_bw`).
    pub link_gbs: Option<f64>,
    /// The same link's latency (us; `link_latency`, given in ns).
    pub link_latency_us: Option<f64>,
}

/// A real run: its requests in send order and its deployment.
#[derive(Debug, Clone, PartialEq)]
pub struct ObservedRun {
    /// The file or directory read.
    pub path: PathBuf,
    /// Its format (`llmservingsim`, `vllm-bench`, `aiperf`, `tracev2`, `csv`).
    pub format: &'static str,
    /// What the files say about the deployment.
    pub engine: ObservedEngine,
    /// The requests, in send order.
    pub requests: Vec<ObservedRequest>,
}

/// Longest run read (requests), so that a corrupt file cannot exhaust memory.
pub const MAX_REQUESTS: usize = 10_000_000;

/// Whether `dir` is an aiperf artifact folder (it holds `profile_export.jsonl`).
pub fn is_aiperf_run(dir: &Path) -> bool {
    dir.join(aiperf::RECORDS_FILE).is_file()
}

/// Reads a run, its format told by its shape: a directory with `vllm/meta.json`
/// (LLMServingSim) or `profile_export.jsonl` (an aiperf artifact folder), a `.json` file
/// (vLLM bench), a `.jsonl` file (aiperf's records), a `.csv` whose header has
/// `send_time_us` (TraceV2) or `send_s` (the plain CSV).
pub fn open(path: &Path) -> Result<ObservedRun, ObservedError> {
    if path.is_dir() {
        if path.join("vllm").join("meta.json").is_file() {
            return llmservingsim::read(path);
        }
        if is_aiperf_run(path) {
            return aiperf::read(path);
        }
        if sim_run::is_sim_run(path) {
            return sim_run::read(path);
        }
        return Err(ObservedError::new(
            path,
            "not a run: a directory must hold vllm/meta.json and vllm/requests.jsonl (LLMServingSim), profile_export.jsonl (aiperf), or requests.csv and plan.json (a run sim serve or sim run wrote)",
        ));
    }
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    match ext {
        "json" => vllm_bench::read(path),
        "jsonl" => aiperf::read(path),
        "csv" => {
            let header = first_line(path)?;
            let cols: Vec<&str> = header.split(',').map(str::trim).collect();
            if cols.contains(&"send_time_us") {
                blis::read(path)
            } else if cols.contains(&"send_s") {
                plain_csv::read(path)
            } else {
                Err(ObservedError::new(
                    path,
                    "unknown CSV run: the header must have `send_time_us` (BLIS TraceV2) or `send_s` (sim's plain run CSV)",
                ))
            }
        }
        _ => Err(ObservedError::new(
            path,
            "unknown run format: give an LLMServingSim run directory, a vLLM bench .json, aiperf's profile_export.jsonl (or its folder), or a .csv (TraceV2 or plain)",
        )),
    }
}

/// The first line of the file at `path` (at most 64 KiB read; a byte-order mark and the
/// line's end left out): a CSV's header.
pub fn first_line(path: &Path) -> Result<String, ObservedError> {
    use std::io::{BufRead, Read};
    let f = std::fs::File::open(path)
        .map_err(|e| ObservedError::new(path, format!("cannot read: {e}")))?;
    let mut line = String::new();
    std::io::BufReader::new(f.take(1 << 16))
        .read_line(&mut line)
        .map_err(|e| ObservedError::new(path, format!("cannot read: {e}")))?;
    Ok(line.trim_start_matches('\u{feff}').trim_end().to_string())
}

/// A run CSV's header: where each column is.
pub(crate) struct Columns<'a> {
    path: &'a Path,
    header: csv::StringRecord,
}

impl Columns<'_> {
    /// The column `name`, if the header has it.
    pub(crate) fn col(&self, name: &str) -> Option<usize> {
        self.header.iter().position(|h| h.trim() == name)
    }

    /// The column `name`, or an error naming it.
    pub(crate) fn need(&self, name: &str) -> Result<usize, ObservedError> {
        self.col(name).ok_or_else(|| {
            ObservedError::at(self.path, Some(1), name, "column not found in the header")
        })
    }

    /// The header's names.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.header.iter().map(str::trim)
    }

    /// An error naming the first column not in `known` (a file's unknown keys are errors).
    pub(crate) fn only(&self, known: &[&str]) -> Result<(), ObservedError> {
        match self.names().find(|h| !known.contains(h)) {
            Some(h) => Err(ObservedError::at(
                self.path,
                Some(1),
                h,
                format!("unknown column (known: {})", known.join(", ")),
            )),
            None => Ok(()),
        }
    }
}

/// Opens a run CSV: its reader and its header.
pub(crate) fn open_csv(
    path: &Path,
) -> Result<(csv::Reader<std::fs::File>, Columns<'_>), ObservedError> {
    let mut rdr = csv::ReaderBuilder::new()
        .from_path(path)
        .map_err(|e| ObservedError::new(path, format!("cannot read: {e}")))?;
    let header = rdr
        .headers()
        .map_err(|e| ObservedError::new(path, format!("malformed CSV: {e}")))?
        .clone();
    Ok((rdr, Columns { path, header }))
}

/// A CSV row the reader could not parse (line `line`).
pub(crate) fn malformed(path: &Path, line: u64, e: &csv::Error) -> ObservedError {
    ObservedError::at(path, Some(line), "row", format!("malformed CSV: {e}"))
}

/// Checks a latency read from a file: finite, not negative.
pub(crate) fn latency(
    path: &Path,
    line: Option<u64>,
    field: &str,
    ms: f64,
) -> Result<f64, ObservedError> {
    if !ms.is_finite() || ms < 0.0 {
        return Err(ObservedError::at(
            path,
            line,
            field,
            format!("must be a finite, non-negative latency, got {ms}"),
        ));
    }
    Ok(ms)
}

/// Requests sorted by an integer send clock (`(time, line, request)`, `per_s` ticks a
/// second), each given its send time in seconds after the first: counted in ticks before
/// they become seconds, since absolute clock readings lose precision as f64.
pub(crate) fn sent_in_order(
    rows: Vec<(u64, u64, ObservedRequest)>,
    per_s: f64,
) -> Vec<ObservedRequest> {
    let t0 = rows.first().map_or(0, |r| r.0);
    rows.into_iter()
        .map(|(t, _, mut r)| {
            r.send_s = Some(t.saturating_sub(t0) as f64 / per_s);
            r
        })
        .collect()
}

/// Turns absolute send times into seconds after the first, checking they never go back.
pub(crate) fn relative_sends(
    path: &Path,
    sends: &[(Option<u64>, f64)],
    field: &str,
) -> Result<Vec<f64>, ObservedError> {
    let t0 = sends.first().map_or(0.0, |s| s.1);
    let mut last = f64::NEG_INFINITY;
    sends
        .iter()
        .map(|&(line, t)| {
            if t < last {
                return Err(ObservedError::at(
                    path,
                    line,
                    field,
                    format!("times must not go back: {t} after {last}"),
                ));
            }
            last = t;
            Ok(t - t0)
        })
        .collect()
}
