//! Workloads: the stream of [`Request`]s a simulation serves.
//!
//! A workload is configured by the `[workload]` table of a scenario file
//! ([`WorkloadConfig`]) and opened into a [`Workload`], an iterator that yields requests
//! lazily, in non-decreasing arrival order (DESIGN.md §2). Two kinds exist:
//!
//! - **synthetic**: arrivals from a process (Poisson, gamma with a burstiness, or all at
//!   once) and, per request, a class drawn by weight whose prompt and output lengths come
//!   from distributions (fixed, uniform, normal, lognormal, empirical CSV column, or joint
//!   lengths from one CSV row);
//! - **trace replay**: an Azure LLM inference 2023 CSV or a Vidur-style CSV, streamed row
//!   by row (a trace may hold millions of rows and is never loaded whole).
//!
//! Randomness is deterministic: every purpose (arrivals, class choice, the lengths of each
//! class) has its own `ChaCha8Rng` seeded from `(seed, purpose)` through SplitMix64, so a
//! draw added in one stream never shifts another, and the same configuration and seed
//! always give the same sequence.

use std::fs::File;
use std::path::{Path, PathBuf};

use chrono::NaiveDateTime;
use engine::request::{Request, SamplingParams, NANOS_PER_SEC};

/// Latest arrival time accepted, in seconds (1e9 s, about 31 years): simulated time is kept
/// in `u64` nanoseconds, and a horizon far below `u64::MAX` leaves room for the run itself.
pub const MAX_ARRIVAL_S: f64 = 1e9;
use rand::distr::weighted::WeightedIndex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp, Gamma, LogNormal, Normal};
use serde::{Deserialize, Serialize};

/// Name of the single class of a trace workload.
pub const TRACE_CLASS_NAME: &str = "trace";

/// Largest trace file (in bytes) whose rows [`Workload::open`] counts up front for
/// [`Workload::expected_len`]; larger traces report no expected length.
const COUNT_ROWS_MAX_BYTES: u64 = 256 * 1024 * 1024;

/// Timestamp format of the Azure LLM inference traces (`2023-11-16 18:17:03.9799600`).
const AZURE_TS_FORMAT: &str = "%Y-%m-%d %H:%M:%S%.f";

// ---------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------

/// The `[workload]` table of a scenario file.
///
/// Either `arrival` plus at least one `[[workload.class]]` (a synthetic workload, which
/// also needs `num_requests` or `duration_s`), or `trace` alone (replay; `num_requests`
/// and `duration_s` are then optional caps).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadConfig {
    /// Stop after this many requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_requests: Option<u64>,
    /// Stop generating arrivals after this simulated time, in seconds: a request whose
    /// arrival is later than this is not yielded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<f64>,
    /// Arrival process of a synthetic workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arrival: Option<ArrivalConfig>,
    /// Trace to replay instead of `arrival` and the classes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceConfig>,
    /// Request classes of a synthetic workload (`[[workload.class]]`).
    #[serde(default, rename = "class", skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<ClassConfig>,
    /// Multi-turn conversations (`[workload.multi_turn]`): `arrival` starts conversations,
    /// each turn resends the whole history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multi_turn: Option<MultiTurnConfig>,
    /// SGLang's generated-shared-prefix dataset (`[workload.generated_shared_prefix]`):
    /// `arrival` paces its requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generated_shared_prefix: Option<GeneratedSharedPrefix>,
}

/// `[workload.multi_turn]`: chat sessions whose every turn sends the system prompt, all
/// earlier user messages and answers, and a new user message (as vLLM's and SGLang's
/// multi-turn benchmarks do). The answers are scripted (their token ids are known), so the
/// KV blocks a turn generates hash like the next turn's history and the prefix cache can
/// reuse them. Open loop: turn `k + 1` arrives an exponential think time after turn `k`
/// arrived, whether or not turn `k` has finished.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MultiTurnConfig {
    /// Turns per conversation.
    pub turns: LengthDist,
    /// Tokens of each new user message.
    pub user: LengthDist,
    /// Tokens of each answer (`max_tokens` of the turn).
    pub output: LengthDist,
    /// Mean time between a turn's arrival and the next turn's (exponential), seconds.
    pub think_time_s: f64,
    /// A system prompt at the start of every conversation, one of `groups`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<SharedPrefix>,
    /// A conversation ends early instead of sending a prompt longer than this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_prompt: Option<u32>,
}

/// `[workload.generated_shared_prefix]`: SGLang's `generated-shared-prefix` benchmark
/// dataset. `groups` system prompts of `system_prompt_len` tokens, each followed by
/// `prompts_per_group` distinct questions of `question_len` tokens; every request asks for
/// `output_len` tokens; the `groups x prompts_per_group` requests are shuffled (seeded).
/// SGLang's defaults: 64 groups, 16 prompts per group, 2048, 128 and 256 tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GeneratedSharedPrefix {
    /// Number of system prompts.
    #[serde(default = "gsp_groups")]
    pub groups: u32,
    /// Questions per system prompt.
    #[serde(default = "gsp_prompts_per_group")]
    pub prompts_per_group: u32,
    /// Tokens of each system prompt.
    #[serde(default = "gsp_system_prompt_len")]
    pub system_prompt_len: u32,
    /// Tokens of each question.
    #[serde(default = "gsp_question_len")]
    pub question_len: u32,
    /// Output tokens of each request.
    #[serde(default = "gsp_output_len")]
    pub output_len: u32,
}

fn gsp_groups() -> u32 {
    64
}
fn gsp_prompts_per_group() -> u32 {
    16
}
fn gsp_system_prompt_len() -> u32 {
    2048
}
fn gsp_question_len() -> u32 {
    128
}
fn gsp_output_len() -> u32 {
    256
}

/// Class names of a multi-turn workload: first turns and follow-up turns.
pub const MULTI_TURN_CLASSES: [&str; 2] = ["first-turn", "follow-up"];
/// Class name of the generated-shared-prefix workload.
pub const GSP_CLASS: &str = "shared-prefix";

/// Arrival process of a synthetic workload (`arrival = { process = "...", ... }`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "process", rename_all = "kebab-case", deny_unknown_fields)]
pub enum ArrivalConfig {
    /// Poisson process: exponential inter-arrival times with mean `1 / rate`.
    Poisson {
        /// Requests per second.
        rate: f64,
    },
    /// Gamma inter-arrival times with shape `burstiness` and scale
    /// `1 / (rate * burstiness)`: mean `1 / rate`, coefficient of variation
    /// `1 / sqrt(burstiness)`. Burstiness 1 is Poisson; below 1 is burstier.
    Gamma {
        /// Requests per second.
        rate: f64,
        /// Gamma shape parameter.
        burstiness: f64,
    },
    /// Every request arrives at time 0 (offline batch); needs `num_requests`.
    AllAtOnce {},
}

/// A trace to replay (`trace = { format = "...", path = "...", time_scale = 1.0 }`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceConfig {
    /// Column layout of the CSV.
    pub format: TraceFormat,
    /// Path of the CSV, relative to the scenario's folder.
    pub path: PathBuf,
    /// Multiplies inter-arrival times (0.5 replays at twice the rate).
    #[serde(default = "default_one")]
    pub time_scale: f64,
}

/// Column layout of a trace CSV.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TraceFormat {
    /// Azure LLM inference trace 2023: `TIMESTAMP,ContextTokens,GeneratedTokens`, with
    /// timestamps like `2023-11-16 18:17:03.9799600`; arrival = timestamp - first
    /// timestamp.
    Azure,
    /// Vidur-style trace: `arrived_at,num_prefill_tokens,num_decode_tokens` (more
    /// columns allowed); `arrived_at` is the arrival in seconds from time 0.
    Vidur,
    /// Mooncake trace (JSON lines): `timestamp` (ms), `input_length`, `output_length`,
    /// `hash_ids` (ids of 512-token prompt blocks; equal ids mean equal content). Prompts get
    /// token ids generated from their hash ids, so shared prefixes really share tokens.
    Mooncake,
}

impl TraceFormat {
    /// Column names of (arrival, prompt length, output length).
    fn columns(self) -> [&'static str; 3] {
        match self {
            TraceFormat::Azure => ["TIMESTAMP", "ContextTokens", "GeneratedTokens"],
            TraceFormat::Vidur => ["arrived_at", "num_prefill_tokens", "num_decode_tokens"],
            TraceFormat::Mooncake => ["timestamp", "input_length", "output_length"],
        }
    }
}

fn default_one() -> f64 {
    1.0
}

/// One request class of a synthetic workload (`[[workload.class]]`).
///
/// Lengths come either from `prompt` and `output` (independent distributions) or from
/// `lengths` (joint prompt and output lengths from one CSV row).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassConfig {
    /// Class name, used in per-class metrics.
    pub name: String,
    /// Relative weight of the class (default 1).
    #[serde(default = "default_one")]
    pub weight: f64,
    /// Distribution of the prompt length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<LengthDist>,
    /// Distribution of the output length (`max_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<LengthDist>,
    /// Joint prompt and output lengths, sampled as whole CSV rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lengths: Option<JointLengths>,
    /// Scheduling priority of the class's requests (lower is served first by the `priority`
    /// queue policy; default 0).
    #[serde(default)]
    pub priority: i32,
    /// Parallel sampling: completions per request (vLLM's `n`; default 1). The prompt is
    /// prefilled once and its KV shared copy-on-write by the `n` sequences.
    #[serde(default = "one_seq")]
    pub n: u32,
    /// Beam search of width `n` (vLLM V0's `use_beam_search`): beams are re-chosen after
    /// every token, so some end and others fork copy-on-write (choices are synthetic).
    #[serde(default)]
    pub beam_search: bool,
    /// Sampling temperature of real backends (default 0: greedy); the cost model ignores it.
    #[serde(default)]
    pub temperature: f32,
    /// Top-k cut of real backends' sampling (default 0: none).
    #[serde(default)]
    pub top_k: u32,
    /// Top-p (nucleus) cut of real backends' sampling, in (0, 1] (default 1: none).
    #[serde(default = "default_top_p")]
    pub top_p: f32,
    /// Speculative decoding's synthetic acceptance for this class's requests (replaces
    /// `speculative.acceptance`: code accepts more drafts than chat): per-position rates...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acceptance: Option<Vec<f64>>,
    /// ...or a mean acceptance length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_acceptance_length: Option<f64>,
    /// A system prompt shared by the class's requests: each request draws one of `groups`
    /// prefixes of `tokens` tokens and puts it before its own prompt (whose length the
    /// `prompt` distribution gives), so the prefix cache sees real sharing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_prefix: Option<SharedPrefix>,
}

/// `shared_prefix = { tokens = 1000, groups = 4 }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedPrefix {
    /// Tokens of each shared prefix.
    pub tokens: u32,
    /// Distinct prefixes (requests pick one uniformly).
    #[serde(default = "one_group")]
    pub groups: u32,
}

fn one_group() -> u32 {
    1
}

fn one_seq() -> u32 {
    1
}

fn default_top_p() -> f32 {
    1.0
}

/// Token `j` of a synthetic prompt part: a fixed hash of (`a`, `b`, `j`) into a 32,000-token
/// vocabulary, so equal parts share tokens without storing any.
pub fn synthetic_token(a: u64, b: u64, j: u32) -> u32 {
    (splitmix64(
        splitmix64(a ^ 0x5EED)
            .wrapping_add(b)
            .wrapping_mul(0x1_0000_0001)
            ^ u64::from(j),
    ) % 32_000) as u32
}

/// Distribution of a token length (`{ dist = "...", ... }`).
///
/// Samples are rounded to integers, clamped to `[min, max]` when given, and at least 1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "dist", rename_all = "kebab-case", deny_unknown_fields)]
pub enum LengthDist {
    /// Always `value`.
    Fixed {
        /// The length.
        value: u32,
    },
    /// Uniform over the integers `min..=max`.
    Uniform {
        /// Smallest length.
        min: u32,
        /// Largest length.
        max: u32,
    },
    /// Normal with this mean and standard deviation.
    Normal {
        /// Mean.
        mean: f64,
        /// Standard deviation.
        std: f64,
        /// Lower clamp.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        min: Option<u32>,
        /// Upper clamp.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max: Option<u32>,
    },
    /// Lognormal whose own mean and standard deviation (not those of its logarithm) are
    /// given.
    #[serde(rename = "lognormal")]
    LogNormal {
        /// Mean of the distribution.
        mean: f64,
        /// Standard deviation of the distribution.
        std: f64,
        /// Lower clamp.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        min: Option<u32>,
        /// Upper clamp.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max: Option<u32>,
    },
    /// The values of one column of a CSV (with a header), sampled uniformly with
    /// replacement.
    Empirical {
        /// Path of the CSV, relative to the scenario's folder.
        path: PathBuf,
        /// Column name.
        column: String,
        /// Lower clamp.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        min: Option<u32>,
        /// Upper clamp.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max: Option<u32>,
    },
}

/// Joint prompt and output lengths: a CSV row drawn uniformly with replacement gives both.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JointLengths {
    /// Path of the CSV (with a header), relative to the scenario's folder.
    pub path: PathBuf,
    /// Column of the prompt length.
    pub prompt_column: String,
    /// Column of the output length.
    pub output_column: String,
}

// ---------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------

/// Errors from configuring, opening or reading a workload.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// A configuration value is missing, misplaced or out of range.
    #[error("{key}: {message}")]
    Config {
        /// Dotted key, e.g. `workload.arrival.rate`.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// A file could not be opened or read.
    #[error("{path}: cannot read: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The CSV itself is malformed (bad quoting, invalid UTF-8, ...).
    #[error("{path}{}: malformed CSV: {message}", line.map(|l| format!(":{l}")).unwrap_or_default())]
    Csv {
        /// The file.
        path: PathBuf,
        /// 1-based line, when known.
        line: Option<u64>,
        /// What the CSV reader reported.
        message: String,
    },
    /// A required column is not in the header.
    #[error("{path}: column `{column}` not found in the header")]
    MissingColumn {
        /// The file.
        path: PathBuf,
        /// The column name.
        column: String,
    },
    /// A column holds no values.
    #[error("{path}: column `{column}` has no values")]
    EmptyColumn {
        /// The file.
        path: PathBuf,
        /// The column name.
        column: String,
    },
    /// A value in a row is missing or invalid.
    #[error("{path}:{line}: column `{column}`: {message} (got {text:?})")]
    BadValue {
        /// The file.
        path: PathBuf,
        /// 1-based line of the row.
        line: u64,
        /// The column name.
        column: String,
        /// The text found.
        text: String,
        /// What is wrong.
        message: String,
    },
}

impl WorkloadError {
    fn config(key: impl Into<String>, message: impl Into<String>) -> Self {
        WorkloadError::Config {
            key: key.into(),
            message: message.into(),
        }
    }

    fn csv(path: &Path, err: &csv::Error) -> Self {
        if let csv::ErrorKind::Io(e) = err.kind() {
            return WorkloadError::Io {
                path: path.to_path_buf(),
                source: std::io::Error::new(e.kind(), e.to_string()),
            };
        }
        WorkloadError::Csv {
            path: path.to_path_buf(),
            line: err.position().map(|p| p.line()),
            message: err.to_string(),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------

fn check_positive(key: &str, v: f64) -> Result<(), WorkloadError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(WorkloadError::config(
            key,
            format!("must be a positive number, got {v}"),
        ))
    }
}

fn check_non_negative(key: &str, v: f64) -> Result<(), WorkloadError> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(WorkloadError::config(
            key,
            format!("must be a non-negative number, got {v}"),
        ))
    }
}

fn check_bounds(key: &str, min: Option<u32>, max: Option<u32>) -> Result<(), WorkloadError> {
    if let Some(max) = max {
        if max == 0 {
            return Err(WorkloadError::config(
                format!("{key}.max"),
                "must be at least 1, got 0",
            ));
        }
        if let Some(min) = min {
            if min > max {
                return Err(WorkloadError::config(
                    format!("{key}.min"),
                    format!("must not exceed {key}.max ({max}), got {min}"),
                ));
            }
        }
    }
    Ok(())
}

fn check_path(key: &str, path: &Path) -> Result<(), WorkloadError> {
    if path.as_os_str().is_empty() {
        Err(WorkloadError::config(key, "must not be empty"))
    } else {
        Ok(())
    }
}

impl LengthDist {
    /// Checks the parameters; `key` is the dotted key of this distribution.
    fn validate(&self, key: &str) -> Result<(), WorkloadError> {
        match self {
            LengthDist::Fixed { value } => {
                if *value == 0 {
                    return Err(WorkloadError::config(
                        format!("{key}.value"),
                        "must be at least 1, got 0",
                    ));
                }
            }
            LengthDist::Uniform { min, max } => check_bounds(key, Some(*min), Some(*max))?,
            LengthDist::Normal {
                mean,
                std,
                min,
                max,
            } => {
                if !mean.is_finite() {
                    return Err(WorkloadError::config(
                        format!("{key}.mean"),
                        format!("must be a finite number, got {mean}"),
                    ));
                }
                check_non_negative(&format!("{key}.std"), *std)?;
                check_bounds(key, *min, *max)?;
            }
            LengthDist::LogNormal {
                mean,
                std,
                min,
                max,
            } => {
                check_positive(&format!("{key}.mean"), *mean)?;
                check_non_negative(&format!("{key}.std"), *std)?;
                check_bounds(key, *min, *max)?;
            }
            LengthDist::Empirical {
                path,
                column,
                min,
                max,
            } => {
                check_path(&format!("{key}.path"), path)?;
                if column.is_empty() {
                    return Err(WorkloadError::config(
                        format!("{key}.column"),
                        "must not be empty",
                    ));
                }
                check_bounds(key, *min, *max)?;
            }
        }
        Ok(())
    }
}

impl WorkloadConfig {
    /// Checks every value and the combination of keys, without touching files.
    ///
    /// Errors name the key, e.g. `workload.arrival.rate: must be a positive number, got -3`.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        if self.num_requests == Some(0) {
            return Err(WorkloadError::config(
                "workload.num_requests",
                "must be at least 1, got 0",
            ));
        }
        if let Some(d) = self.duration_s {
            check_positive("workload.duration_s", d)?;
        }
        match (&self.arrival, &self.trace) {
            (Some(_), Some(_)) => {
                return Err(WorkloadError::config(
                    "workload.trace",
                    "give either workload.arrival (synthetic) or workload.trace (replay), not both",
                ))
            }
            (None, None) => {
                return Err(WorkloadError::config(
                    "workload.arrival",
                    "missing: give workload.arrival (synthetic) or workload.trace (replay)",
                ))
            }
            (None, Some(trace)) => {
                check_path("workload.trace.path", &trace.path)?;
                check_positive("workload.trace.time_scale", trace.time_scale)?;
                if !self.classes.is_empty() {
                    return Err(WorkloadError::config(
                        "workload.class",
                        "not allowed with workload.trace (the trace gives the lengths)",
                    ));
                }
                if self.multi_turn.is_some() || self.generated_shared_prefix.is_some() {
                    return Err(WorkloadError::config(
                        "workload.trace",
                        "not allowed with a generated workload (multi_turn or generated_shared_prefix)",
                    ));
                }
            }
            (Some(arrival), None) => {
                match arrival {
                    ArrivalConfig::Poisson { rate } => {
                        check_positive("workload.arrival.rate", *rate)?
                    }
                    ArrivalConfig::Gamma { rate, burstiness } => {
                        check_positive("workload.arrival.rate", *rate)?;
                        check_positive("workload.arrival.burstiness", *burstiness)?;
                    }
                    ArrivalConfig::AllAtOnce {} => {
                        if self.num_requests.is_none() {
                            return Err(WorkloadError::config(
                                "workload.num_requests",
                                "required with arrival process \"all-at-once\"",
                            ));
                        }
                    }
                }
                let generators = [
                    ("workload.multi_turn", self.multi_turn.is_some()),
                    (
                        "workload.generated_shared_prefix",
                        self.generated_shared_prefix.is_some(),
                    ),
                ];
                let chosen: Vec<&str> = generators
                    .iter()
                    .filter(|(_, on)| *on)
                    .map(|(k, _)| *k)
                    .collect();
                match chosen.as_slice() {
                    [] => {}
                    [one] => {
                        if !self.classes.is_empty() {
                            return Err(WorkloadError::config(
                                "workload.class",
                                format!("not allowed with {one} (it gives the lengths)"),
                            ));
                        }
                    }
                    _ => {
                        return Err(WorkloadError::config(
                            chosen[1],
                            format!("give one of {}, not both", chosen.join(" and ")),
                        ))
                    }
                }
                if let Some(g) = &self.generated_shared_prefix {
                    for (k, v) in [
                        ("groups", g.groups),
                        ("prompts_per_group", g.prompts_per_group),
                        ("system_prompt_len", g.system_prompt_len),
                        ("question_len", g.question_len),
                        ("output_len", g.output_len),
                    ] {
                        if v == 0 {
                            return Err(WorkloadError::config(
                                format!("workload.generated_shared_prefix.{k}"),
                                "must be at least 1, got 0",
                            ));
                        }
                    }
                    if u64::from(g.groups) * u64::from(g.prompts_per_group) > 1 << 26 {
                        return Err(WorkloadError::config(
                            "workload.generated_shared_prefix.groups",
                            "groups x prompts_per_group must be at most 2^26",
                        ));
                    }
                    return Ok(());
                }
                if self.num_requests.is_none() && self.duration_s.is_none() {
                    return Err(WorkloadError::config(
                        "workload.num_requests",
                        "a synthetic workload needs workload.num_requests or workload.duration_s",
                    ));
                }
                if let Some(m) = &self.multi_turn {
                    let key = "workload.multi_turn";
                    m.turns.validate(&format!("{key}.turns"))?;
                    m.user.validate(&format!("{key}.user"))?;
                    m.output.validate(&format!("{key}.output"))?;
                    check_positive(&format!("{key}.think_time_s"), m.think_time_s)?;
                    if let Some(p) = m.system_prompt {
                        if p.groups == 0 {
                            return Err(WorkloadError::config(
                                format!("{key}.system_prompt.groups"),
                                "must be at least 1, got 0",
                            ));
                        }
                    }
                    if m.max_prompt == Some(0) {
                        return Err(WorkloadError::config(
                            format!("{key}.max_prompt"),
                            "must be at least 1, got 0",
                        ));
                    }
                    return Ok(());
                }
                self.validate_classes()?;
            }
        }
        Ok(())
    }

    fn validate_classes(&self) -> Result<(), WorkloadError> {
        if self.classes.is_empty() {
            return Err(WorkloadError::config(
                "workload.class",
                "a synthetic workload needs at least one [[workload.class]]",
            ));
        }
        if self.classes.len() > usize::from(u16::MAX) + 1 {
            return Err(WorkloadError::config(
                "workload.class",
                format!(
                    "at most {} classes, got {}",
                    usize::from(u16::MAX) + 1,
                    self.classes.len()
                ),
            ));
        }
        for (i, class) in self.classes.iter().enumerate() {
            let key = format!("workload.class[{i}]");
            if class.name.is_empty() {
                return Err(WorkloadError::config(
                    format!("{key}.name"),
                    "must not be empty",
                ));
            }
            if self.classes[..i].iter().any(|c| c.name == class.name) {
                return Err(WorkloadError::config(
                    format!("{key}.name"),
                    format!("duplicate class name {:?}", class.name),
                ));
            }
            check_positive(&format!("{key}.weight"), class.weight)?;
            if class.beam_search && class.n < 2 {
                return Err(WorkloadError::config(
                    format!("{key}.n"),
                    "beam search needs a beam width n of at least 2",
                ));
            }
            if !class.temperature.is_finite() || class.temperature < 0.0 {
                return Err(WorkloadError::config(
                    format!("{key}.temperature"),
                    format!("must be 0 (greedy) or positive, got {}", class.temperature),
                ));
            }
            if !(class.top_p > 0.0 && class.top_p <= 1.0) {
                return Err(WorkloadError::config(
                    format!("{key}.top_p"),
                    format!("must be in (0, 1], got {}", class.top_p),
                ));
            }
            if !(1..=256).contains(&class.n) {
                return Err(WorkloadError::config(
                    format!("{key}.n"),
                    format!("must be from 1 to 256, got {}", class.n),
                ));
            }
            match (&class.prompt, &class.output, &class.lengths) {
                (Some(p), Some(o), None) => {
                    p.validate(&format!("{key}.prompt"))?;
                    o.validate(&format!("{key}.output"))?;
                }
                (None, None, Some(j)) => {
                    check_path(&format!("{key}.lengths.path"), &j.path)?;
                    if j.prompt_column.is_empty() {
                        return Err(WorkloadError::config(
                            format!("{key}.lengths.prompt_column"),
                            "must not be empty",
                        ));
                    }
                    if j.output_column.is_empty() {
                        return Err(WorkloadError::config(
                            format!("{key}.lengths.output_column"),
                            "must not be empty",
                        ));
                    }
                }
                (_, _, Some(_)) => {
                    return Err(WorkloadError::config(
                        format!("{key}.lengths"),
                        "give either lengths or prompt and output, not both",
                    ))
                }
                (None, _, None) => {
                    return Err(WorkloadError::config(
                        format!("{key}.prompt"),
                        "missing: give prompt and output, or lengths",
                    ))
                }
                (Some(_), None, None) => {
                    return Err(WorkloadError::config(
                        format!("{key}.output"),
                        "missing: give prompt and output, or lengths",
                    ))
                }
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Random streams
// ---------------------------------------------------------------------------------------

/// One step of SplitMix64 (Steele, Lea, Flood 2014) on `x`.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Purpose of the arrival stream.
const PURPOSE_ARRIVALS: u64 = 1;
/// Purpose of the class-choice stream.
const PURPOSE_CLASS: u64 = 2;

/// Purpose of the prompt-length (or joint-length) stream of class `i`.
fn purpose_prompt(i: usize) -> u64 {
    0x1_0000 + 2 * i as u64
}

/// Purpose of the output-length stream of class `i`.
fn purpose_output(i: usize) -> u64 {
    0x1_0000 + 2 * i as u64 + 1
}

/// A generator for `purpose`, independent of every other purpose under the same seed.
fn stream(seed: u64, purpose: u64) -> ChaCha8Rng {
    let mut state = splitmix64(seed) ^ splitmix64(purpose.wrapping_mul(0xD1B5_4A32_D192_ED03));
    let mut key = [0u8; 32];
    for chunk in key.chunks_exact_mut(8) {
        state = splitmix64(state);
        chunk.copy_from_slice(&state.to_le_bytes());
    }
    ChaCha8Rng::from_seed(key)
}

// ---------------------------------------------------------------------------------------
// CSV helpers
// ---------------------------------------------------------------------------------------

fn open_csv(path: &Path) -> Result<csv::Reader<File>, WorkloadError> {
    let file = File::open(path).map_err(|source| WorkloadError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(csv::ReaderBuilder::new()
        .has_headers(true)
        .flexible(true)
        .trim(csv::Trim::All)
        .from_reader(file))
}

/// Index of each of `columns` in the header of `reader`.
fn column_indices<const N: usize>(
    reader: &mut csv::Reader<File>,
    path: &Path,
    columns: [&str; N],
) -> Result<[usize; N], WorkloadError> {
    let headers = reader.headers().map_err(|e| WorkloadError::csv(path, &e))?;
    let mut out = [0usize; N];
    for (slot, column) in out.iter_mut().zip(columns) {
        *slot = headers
            .iter()
            .position(|h| h.trim_start_matches('\u{feff}') == column)
            .ok_or_else(|| WorkloadError::MissingColumn {
                path: path.to_path_buf(),
                column: column.to_string(),
            })?;
    }
    Ok(out)
}

/// 1-based line of `record` (0 when unknown, which the csv reader never leaves it).
fn record_line(record: &csv::StringRecord) -> u64 {
    record.position().map_or(0, |p| p.line())
}

/// The text of column `idx` of `record`, or an error naming the missing column.
fn field<'r>(
    record: &'r csv::StringRecord,
    idx: usize,
    path: &Path,
    column: &str,
) -> Result<&'r str, WorkloadError> {
    match record.get(idx) {
        Some(text) if !text.is_empty() => Ok(text),
        other => Err(WorkloadError::BadValue {
            path: path.to_path_buf(),
            line: record_line(record),
            column: column.to_string(),
            text: other.unwrap_or_default().to_string(),
            message: "missing value".to_string(),
        }),
    }
}

/// Parses a token count: a non-negative number (rounded to an integer) that fits in u32.
fn parse_count(
    text: &str,
    record: &csv::StringRecord,
    path: &Path,
    column: &str,
) -> Result<u32, WorkloadError> {
    let bad = |message: &str| WorkloadError::BadValue {
        path: path.to_path_buf(),
        line: record_line(record),
        column: column.to_string(),
        text: text.to_string(),
        message: message.to_string(),
    };
    if let Ok(v) = text.parse::<u32>() {
        return Ok(v);
    }
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => {
            let r = v.round();
            if r <= f64::from(u32::MAX) {
                Ok(r as u32)
            } else {
                Err(bad("token count too large"))
            }
        }
        _ => Err(bad("expected a non-negative token count")),
    }
}

/// Loads the values of `columns` of every row of a CSV, as token counts.
fn load_counts<const N: usize>(
    path: &Path,
    columns: [&str; N],
) -> Result<Vec<[u32; N]>, WorkloadError> {
    let mut reader = open_csv(path)?;
    let idx = column_indices(&mut reader, path, columns)?;
    let mut record = csv::StringRecord::new();
    let mut rows = Vec::new();
    while reader
        .read_record(&mut record)
        .map_err(|e| WorkloadError::csv(path, &e))?
    {
        let mut row = [0u32; N];
        for ((slot, &i), column) in row.iter_mut().zip(&idx).zip(columns) {
            let text = field(&record, i, path, column)?;
            *slot = parse_count(text, &record, path, column)?;
        }
        rows.push(row);
    }
    if rows.is_empty() {
        return Err(WorkloadError::EmptyColumn {
            path: path.to_path_buf(),
            column: columns.join(", "),
        });
    }
    Ok(rows)
}

// ---------------------------------------------------------------------------------------
// Samplers
// ---------------------------------------------------------------------------------------

/// Rounds `x`, clamps it to `[lo, hi]` and to at least 1.
fn to_len(x: f64, lo: u32, hi: u32) -> u32 {
    // `as` saturates (NaN gives 0), then the clamp applies the bounds.
    let v = x.round() as u32;
    v.clamp(lo, hi).max(1)
}

/// Bounds `[lo, hi]` with defaults `[1, u32::MAX]`.
fn bounds(min: Option<u32>, max: Option<u32>) -> (u32, u32) {
    let lo = min.unwrap_or(1);
    let hi = max.unwrap_or(u32::MAX).max(lo);
    (lo, hi)
}

/// A length distribution ready to sample.
#[derive(Debug, Clone)]
enum LenSampler {
    Fixed(u32),
    Uniform(u32, u32),
    Normal(Normal<f64>, u32, u32),
    LogNormal(LogNormal<f64>, u32, u32),
    Empirical(Vec<u32>, u32, u32),
}

impl LenSampler {
    fn new(dist: &LengthDist, base_dir: &Path, key: &str) -> Result<Self, WorkloadError> {
        let param_err = |e: rand_distr::NormalError| {
            WorkloadError::config(key, format!("invalid distribution parameters: {e}"))
        };
        Ok(match dist {
            LengthDist::Fixed { value } => LenSampler::Fixed((*value).max(1)),
            LengthDist::Uniform { min, max } => LenSampler::Uniform(*min, (*max).max(*min)),
            LengthDist::Normal {
                mean,
                std,
                min,
                max,
            } => {
                let (lo, hi) = bounds(*min, *max);
                LenSampler::Normal(Normal::new(*mean, *std).map_err(param_err)?, lo, hi)
            }
            LengthDist::LogNormal {
                mean,
                std,
                min,
                max,
            } => {
                // Mean m and std s of the lognormal itself: sigma^2 = ln(1 + s^2/m^2),
                // mu = ln(m) - sigma^2/2.
                let sigma2 = (1.0 + (std / mean).powi(2)).ln();
                let mu = mean.ln() - sigma2 / 2.0;
                let (lo, hi) = bounds(*min, *max);
                LenSampler::LogNormal(
                    LogNormal::new(mu, sigma2.sqrt()).map_err(param_err)?,
                    lo,
                    hi,
                )
            }
            LengthDist::Empirical {
                path,
                column,
                min,
                max,
            } => {
                let full = base_dir.join(path);
                let values = load_counts(&full, [column.as_str()])?
                    .into_iter()
                    .map(|[v]| v)
                    .collect();
                let (lo, hi) = bounds(*min, *max);
                LenSampler::Empirical(values, lo, hi)
            }
        })
    }

    fn sample(&self, rng: &mut ChaCha8Rng) -> u32 {
        match self {
            LenSampler::Fixed(v) => *v,
            LenSampler::Uniform(lo, hi) => rng.random_range(*lo..=*hi).max(1),
            LenSampler::Normal(d, lo, hi) => to_len(d.sample(rng), *lo, *hi),
            LenSampler::LogNormal(d, lo, hi) => to_len(d.sample(rng), *lo, *hi),
            LenSampler::Empirical(values, lo, hi) => {
                let v = values[rng.random_range(0..values.len())];
                v.clamp(*lo, *hi).max(1)
            }
        }
    }
}

/// Where one class's lengths come from.
#[derive(Debug, Clone)]
enum ClassLengths {
    /// Independent prompt and output distributions.
    Separate(LenSampler, LenSampler),
    /// Whole CSV rows of (prompt, output).
    Joint(Vec<[u32; 2]>),
}

/// One class's length sampler with its random streams.
#[derive(Debug, Clone)]
struct ClassSampler {
    lengths: ClassLengths,
    /// Stream of prompt lengths (and of joint rows).
    prompt_rng: ChaCha8Rng,
    /// Stream of output lengths.
    output_rng: ChaCha8Rng,
}

impl ClassSampler {
    fn sample(&mut self) -> (u32, u32) {
        match &self.lengths {
            ClassLengths::Separate(prompt, output) => (
                prompt.sample(&mut self.prompt_rng),
                output.sample(&mut self.output_rng),
            ),
            ClassLengths::Joint(rows) => {
                let [p, o] = rows[self.prompt_rng.random_range(0..rows.len())];
                (p.max(1), o.max(1))
            }
        }
    }
}

/// Inter-arrival time distribution.
#[derive(Debug, Clone)]
enum Gaps {
    Exp(Exp<f64>),
    Gamma(Gamma<f64>),
    Zero,
}

/// A synthetic workload's state.
#[derive(Debug, Clone)]
struct Synthetic {
    /// Per class: its shared prefix and the stream choosing the group.
    prefixes: Vec<Option<(SharedPrefix, ChaCha8Rng)>>,
    gaps: Gaps,
    /// Time of the last arrival, in seconds.
    t: f64,
    arrival_rng: ChaCha8Rng,
    class_rng: ChaCha8Rng,
    class_index: WeightedIndex<f64>,
    classes: Vec<ClassSampler>,
}

/// One generated request: arrival (s), prompt ids, output length, class, scripted answer.
struct Generated {
    arrival_s: f64,
    prompt: Vec<u32>,
    max_tokens: u32,
    class: u16,
    script: Vec<u32>,
}

/// Draws the next inter-arrival gap (seconds).
fn draw_gap(gaps: &Gaps, rng: &mut ChaCha8Rng) -> f64 {
    match gaps {
        Gaps::Exp(d) => d.sample(rng),
        Gaps::Gamma(d) => d.sample(rng),
        Gaps::Zero => 0.0,
    }
}

/// Namespaces of [`synthetic_token`] for the generated workloads (distinct from class
/// indices, so their tokens never collide with class prefixes).
const NS_SYSTEM: u64 = 0x5359_5354_0000_0000;
const NS_CONVERSATION: u64 = 0x434F_4E56_0000_0000;
const NS_GSP_SYSTEM: u64 = 0x4753_5053_0000_0000;
const NS_GSP_QUESTION: u64 = 0x4753_5051_0000_0000;

/// A live conversation of a multi-turn workload.
#[derive(Debug)]
struct Conversation {
    id: u64,
    history: Vec<u32>,
    turn: u32,
    turns_left: u32,
}

/// Multi-turn conversations, generated lazily in arrival order: one pending conversation
/// start plus a heap of pending follow-up turns (memory follows the live conversations).
#[derive(Debug)]
struct MultiTurn {
    cfg: MultiTurnConfig,
    turns: LenSampler,
    user: LenSampler,
    output: LenSampler,
    think: Exp<f64>,
    gaps: Gaps,
    /// Time of the last conversation start, in seconds.
    t: f64,
    next_start: Option<f64>,
    arrival_rng: ChaCha8Rng,
    len_rng: ChaCha8Rng,
    think_rng: ChaCha8Rng,
    group_rng: ChaCha8Rng,
    /// Pending follow-ups: (arrival ns, sequence number, conversation id) and the time.
    pending: std::collections::BinaryHeap<std::cmp::Reverse<(u64, u64, u64)>>,
    pending_s: rustc_hash::FxHashMap<u64, f64>,
    live: rustc_hash::FxHashMap<u64, Conversation>,
    next_conv: u64,
    seq: u64,
}

impl MultiTurn {
    fn new(
        cfg: &MultiTurnConfig,
        gaps: Gaps,
        base_dir: &Path,
        seed: u64,
    ) -> Result<Self, WorkloadError> {
        let key = "workload.multi_turn";
        let think = Exp::new(1.0 / cfg.think_time_s).map_err(|e| {
            WorkloadError::config(format!("{key}.think_time_s"), format!("invalid: {e}"))
        })?;
        Ok(MultiTurn {
            turns: LenSampler::new(&cfg.turns, base_dir, &format!("{key}.turns"))?,
            user: LenSampler::new(&cfg.user, base_dir, &format!("{key}.user"))?,
            output: LenSampler::new(&cfg.output, base_dir, &format!("{key}.output"))?,
            cfg: cfg.clone(),
            think,
            gaps,
            t: 0.0,
            next_start: None,
            arrival_rng: stream(seed, PURPOSE_ARRIVALS),
            len_rng: stream(seed, 0x3_0000),
            think_rng: stream(seed, 0x3_0001),
            group_rng: stream(seed, 0x3_0002),
            pending: std::collections::BinaryHeap::new(),
            pending_s: rustc_hash::FxHashMap::default(),
            live: rustc_hash::FxHashMap::default(),
            next_conv: 0,
            seq: 0,
        })
    }

    /// The next turn in arrival order (ties: earlier-scheduled first).
    fn next(&mut self) -> Generated {
        let start = *self.next_start.get_or_insert_with(|| {
            self.t += draw_gap(&self.gaps, &mut self.arrival_rng);
            self.t
        });
        let follow = self
            .pending
            .peek()
            .map(|std::cmp::Reverse((_, _, c))| (*c, self.pending_s[c]));
        let (conv, t) = match follow {
            Some((c, t)) if t <= start => {
                self.pending.pop();
                self.pending_s.remove(&c);
                (c, t)
            }
            _ => {
                self.next_start = None;
                let id = self.next_conv;
                self.next_conv += 1;
                let mut history = Vec::new();
                if let Some(sp) = self.cfg.system_prompt {
                    let g = self.group_rng.random_range(0..sp.groups.max(1));
                    history.extend(
                        (0..sp.tokens).map(|j| synthetic_token(NS_SYSTEM, u64::from(g), j)),
                    );
                }
                let turns = self.turns.sample(&mut self.len_rng).max(1);
                self.live.insert(
                    id,
                    Conversation {
                        id,
                        history,
                        turn: 0,
                        turns_left: turns,
                    },
                );
                (id, start)
            }
        };
        let mut c = self.live.remove(&conv).unwrap_or(Conversation {
            id: conv,
            history: Vec::new(),
            turn: 0,
            turns_left: 1,
        });
        let ns = NS_CONVERSATION ^ c.id;
        let u = self.user.sample(&mut self.len_rng);
        c.history
            .extend((0..u).map(|j| synthetic_token(ns, 2 * u64::from(c.turn), j)));
        let prompt = c.history.clone();
        let o = self.output.sample(&mut self.len_rng);
        let script: Vec<u32> = (0..o)
            .map(|j| synthetic_token(ns, 2 * u64::from(c.turn) + 1, j))
            .collect();
        c.history.extend_from_slice(&script);
        let class = u16::from(c.turn > 0);
        c.turn += 1;
        c.turns_left -= 1;
        let fits = self
            .cfg
            .max_prompt
            .is_none_or(|m| c.history.len() < m as usize);
        if c.turns_left > 0 && fits {
            let next = t + self.think.sample(&mut self.think_rng);
            let key = (next * NANOS_PER_SEC).round() as u64;
            self.pending.push(std::cmp::Reverse((key, self.seq, c.id)));
            self.seq += 1;
            self.pending_s.insert(c.id, next);
            self.live.insert(c.id, c);
        }
        Generated {
            arrival_s: t,
            prompt,
            max_tokens: o,
            class,
            script,
        }
    }
}

/// SGLang's generated-shared-prefix dataset: a seeded shuffle of (group, question) pairs.
#[derive(Debug)]
struct SharedPrefixGen {
    cfg: GeneratedSharedPrefix,
    order: Vec<(u32, u32)>,
    pos: usize,
    gaps: Gaps,
    t: f64,
    arrival_rng: ChaCha8Rng,
}

impl SharedPrefixGen {
    fn new(cfg: &GeneratedSharedPrefix, gaps: Gaps, seed: u64) -> Self {
        use rand::seq::SliceRandom;
        let mut order: Vec<(u32, u32)> = (0..cfg.groups)
            .flat_map(|g| (0..cfg.prompts_per_group).map(move |q| (g, q)))
            .collect();
        order.shuffle(&mut stream(seed, 0x4_0000));
        SharedPrefixGen {
            cfg: *cfg,
            order,
            pos: 0,
            gaps,
            t: 0.0,
            arrival_rng: stream(seed, PURPOSE_ARRIVALS),
        }
    }

    fn next(&mut self) -> Option<Generated> {
        let &(g, q) = self.order.get(self.pos)?;
        self.pos += 1;
        self.t += draw_gap(&self.gaps, &mut self.arrival_rng);
        let c = &self.cfg;
        let prompt =
            (0..c.system_prompt_len)
                .map(|j| synthetic_token(NS_GSP_SYSTEM, u64::from(g), j))
                .chain((0..c.question_len).map(|j| {
                    synthetic_token(NS_GSP_QUESTION, (u64::from(g) << 32) | u64::from(q), j)
                }))
                .collect();
        Some(Generated {
            arrival_s: self.t,
            prompt,
            max_tokens: c.output_len,
            class: 0,
            script: Vec::new(),
        })
    }
}

/// Result of reading one trace row.
struct TraceRow {
    arrival_s: f64,
    prompt_len: u32,
    max_tokens: u32,
}

/// A trace being streamed.
#[derive(Debug)]
struct TraceReader {
    path: PathBuf,
    format: TraceFormat,
    reader: csv::Reader<File>,
    record: csv::StringRecord,
    idx: [usize; 3],
    time_scale: f64,
    /// First Azure timestamp (arrivals are relative to it).
    first_ts: Option<NaiveDateTime>,
    /// Previous Azure timestamp.
    prev_ts: Option<NaiveDateTime>,
    /// Previous Vidur `arrived_at`.
    prev_secs: Option<f64>,
    clamped_outputs: u64,
    clamped_prompts: u64,
}

impl TraceReader {
    fn open(cfg: &TraceConfig, base_dir: &Path) -> Result<Self, WorkloadError> {
        let path = base_dir.join(&cfg.path);
        let mut reader = open_csv(&path)?;
        let idx = column_indices(&mut reader, &path, cfg.format.columns())?;
        Ok(TraceReader {
            path,
            format: cfg.format,
            reader,
            record: csv::StringRecord::new(),
            idx,
            time_scale: cfg.time_scale,
            first_ts: None,
            prev_ts: None,
            prev_secs: None,
            clamped_outputs: 0,
            clamped_prompts: 0,
        })
    }

    /// Reads the next row; `None` at the end of the file.
    fn next_row(&mut self) -> Result<Option<TraceRow>, WorkloadError> {
        let more = self
            .reader
            .read_record(&mut self.record)
            .map_err(|e| WorkloadError::csv(&self.path, &e))?;
        if !more {
            return Ok(None);
        }
        let [c_time, c_prompt, c_output] = self.format.columns();
        let record = &self.record;
        let path = self.path.as_path();
        let bad = |column: &str, text: &str, message: String| WorkloadError::BadValue {
            path: path.to_path_buf(),
            line: record_line(record),
            column: column.to_string(),
            text: text.to_string(),
            message,
        };

        let time_text = field(record, self.idx[0], path, c_time)?;
        let rel_secs = match self.format {
            TraceFormat::Azure => {
                let ts =
                    NaiveDateTime::parse_from_str(time_text, AZURE_TS_FORMAT).map_err(|e| {
                        bad(
                            c_time,
                            time_text,
                            format!("expected a timestamp like 2023-11-16 18:17:03.9799600 ({e})"),
                        )
                    })?;
                if let Some(prev) = self.prev_ts {
                    if ts < prev {
                        return Err(bad(
                            c_time,
                            time_text,
                            format!("earlier than the previous row ({prev})"),
                        ));
                    }
                }
                self.prev_ts = Some(ts);
                let first = *self.first_ts.get_or_insert(ts);
                let delta = ts - first;
                match delta.num_nanoseconds() {
                    Some(ns) => ns as f64 / NANOS_PER_SEC,
                    None => delta.num_milliseconds() as f64 / 1e3,
                }
            }
            // Mooncake traces are JSON lines, read by MooncakeReader.
            TraceFormat::Mooncake => {
                return Err(bad(c_time, time_text, "not a CSV trace format".into()))
            }
            TraceFormat::Vidur => {
                let secs = match time_text.parse::<f64>() {
                    Ok(v) if v.is_finite() && v >= 0.0 => v,
                    _ => {
                        return Err(bad(
                            c_time,
                            time_text,
                            "expected a non-negative number of seconds".to_string(),
                        ))
                    }
                };
                if let Some(prev) = self.prev_secs {
                    if secs < prev {
                        return Err(bad(
                            c_time,
                            time_text,
                            format!("earlier than the previous row ({prev})"),
                        ));
                    }
                }
                self.prev_secs = Some(secs);
                secs
            }
        };

        let prompt_text = field(record, self.idx[1], path, c_prompt)?;
        let prompt = parse_count(prompt_text, record, path, c_prompt)?;
        let output_text = field(record, self.idx[2], path, c_output)?;
        let output = parse_count(output_text, record, path, c_output)?;
        if prompt == 0 {
            self.clamped_prompts += 1;
        }
        if output == 0 {
            self.clamped_outputs += 1;
        }
        Ok(Some(TraceRow {
            arrival_s: rel_secs * self.time_scale,
            prompt_len: prompt.max(1),
            max_tokens: output.max(1),
        }))
    }
}

/// Counts the data rows of a CSV (without parsing values).
fn count_rows(path: &Path) -> Result<u64, WorkloadError> {
    let mut reader = open_csv(path)?;
    let mut record = csv::ByteRecord::new();
    let mut n = 0u64;
    while reader
        .read_byte_record(&mut record)
        .map_err(|e| WorkloadError::csv(path, &e))?
    {
        n += 1;
    }
    Ok(n)
}

#[derive(Debug)]
enum Source {
    Synthetic(Box<Synthetic>),
    MultiTurn(Box<MultiTurn>),
    SharedPrefix(Box<SharedPrefixGen>),
    Trace(Box<TraceReader>),
    Mooncake(Box<MooncakeReader>),
}

/// Tokens per Mooncake hash id.
pub const MOONCAKE_BLOCK_TOKENS: usize = 512;

/// Token id `i` of the Mooncake block with hash id `h`: a fixed hash into a 32,000-token
/// vocabulary, so equal hash ids give equal token sequences.
pub fn mooncake_token(h: u64, i: usize) -> u32 {
    let mut z = h
        .wrapping_mul(MOONCAKE_BLOCK_TOKENS as u64)
        .wrapping_add(i as u64)
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) % 32_000) as u32
}

/// (arrival s, prompt length, output length, prompt token ids).
type MooncakeRequest = (f64, u32, u32, Vec<u32>);

#[derive(Deserialize)]
struct MooncakeRow {
    timestamp: f64,
    input_length: u64,
    output_length: u64,
    hash_ids: Vec<u64>,
}

/// A Mooncake JSON-lines trace, streamed line by line.
#[derive(Debug)]
struct MooncakeReader {
    path: PathBuf,
    lines: std::io::Lines<std::io::BufReader<File>>,
    line: u64,
    time_scale: f64,
    prev_ms: f64,
    clamped_outputs: u64,
    clamped_prompts: u64,
}

impl MooncakeReader {
    fn open(cfg: &TraceConfig, base_dir: &Path) -> Result<Self, WorkloadError> {
        use std::io::BufRead;
        let path = base_dir.join(&cfg.path);
        let file = File::open(&path).map_err(|source| WorkloadError::Io {
            path: path.clone(),
            source,
        })?;
        Ok(MooncakeReader {
            path,
            lines: std::io::BufReader::new(file).lines(),
            line: 0,
            time_scale: cfg.time_scale,
            prev_ms: 0.0,
            clamped_outputs: 0,
            clamped_prompts: 0,
        })
    }

    /// Next request: (arrival s, prompt length, output length, prompt token ids).
    fn next_row(&mut self) -> Result<Option<MooncakeRequest>, WorkloadError> {
        loop {
            let Some(line) = self.lines.next() else {
                return Ok(None);
            };
            self.line += 1;
            let line = line.map_err(|source| WorkloadError::Io {
                path: self.path.clone(),
                source,
            })?;
            if line.trim().is_empty() {
                continue;
            }
            let bad = |column: &str, text: &str, message: String| WorkloadError::BadValue {
                path: self.path.clone(),
                line: self.line,
                column: column.into(),
                text: text.chars().take(80).collect(),
                message,
            };
            let row: MooncakeRow = serde_json::from_str(&line)
                .map_err(|e| bad("json", &line, format!("not a Mooncake trace row: {e}")))?;
            if !(row.timestamp.is_finite() && row.timestamp >= self.prev_ms) {
                return Err(bad(
                    "timestamp",
                    &row.timestamp.to_string(),
                    format!(
                        "must be a finite time not before the previous row ({} ms)",
                        self.prev_ms
                    ),
                ));
            }
            self.prev_ms = row.timestamp;
            let to_u32 = |v: u64, col: &str| {
                u32::try_from(v).map_err(|_| bad(col, &v.to_string(), "too large".into()))
            };
            let mut prompt = to_u32(row.input_length, "input_length")?;
            let mut output = to_u32(row.output_length, "output_length")?;
            let capacity = row.hash_ids.len() * MOONCAKE_BLOCK_TOKENS;
            if prompt as usize > capacity {
                return Err(bad(
                    "hash_ids",
                    &format!("{} ids", row.hash_ids.len()),
                    format!(
                        "{} blocks of {MOONCAKE_BLOCK_TOKENS} tokens cannot hold input_length {prompt}",
                        row.hash_ids.len()
                    ),
                ));
            }
            if prompt == 0 {
                prompt = 1;
                self.clamped_prompts += 1;
            }
            if output == 0 {
                output = 1;
                self.clamped_outputs += 1;
            }
            let tokens = (0..prompt as usize)
                .map(|i| {
                    let h = row
                        .hash_ids
                        .get(i / MOONCAKE_BLOCK_TOKENS)
                        .copied()
                        .unwrap_or(0);
                    mooncake_token(h, i % MOONCAKE_BLOCK_TOKENS)
                })
                .collect();
            return Ok(Some((
                row.timestamp / 1000.0 * self.time_scale,
                prompt,
                output,
                tokens,
            )));
        }
    }
}

// ---------------------------------------------------------------------------------------
// Workload
// ---------------------------------------------------------------------------------------

/// An opened workload: an iterator of requests in non-decreasing arrival order.
///
/// Requests are produced lazily; only the current trace row is in memory. Ids are
/// `0, 1, 2, ...` in arrival order. After an error the iterator ends.
#[derive(Debug)]
pub struct Workload {
    source: Source,
    class_names: Vec<String>,
    class_priorities: Vec<i32>,
    class_n: Vec<u32>,
    class_beam: Vec<bool>,
    class_sampling: Vec<SamplingParams>,
    /// Seeds each request's sampling (with its id).
    seed: u64,
    num_requests: Option<u64>,
    duration_s: Option<f64>,
    expected_len: Option<u64>,
    next_id: u64,
    done: bool,
}

impl Workload {
    /// Validates `cfg`, loads the empirical and joint-length CSVs, opens the trace (if
    /// any), and seeds the random streams from `seed`. Relative paths are resolved
    /// against `base_dir` (the scenario file's folder).
    pub fn open(
        cfg: &WorkloadConfig,
        base_dir: &Path,
        seed: u64,
    ) -> Result<Workload, WorkloadError> {
        cfg.validate()?;
        let (source, class_names, expected_len) = match (&cfg.trace, &cfg.arrival) {
            (Some(trace), _) if trace.format == TraceFormat::Mooncake => {
                let reader = MooncakeReader::open(trace, base_dir)?;
                let expected = std::fs::read(&reader.path)
                    .ok()
                    .map(|b| b.iter().filter(|&&c| c == b'\n').count() as u64);
                let expected = match (expected, cfg.num_requests) {
                    (Some(r), Some(n)) => Some(r.min(n)),
                    (r, n) => r.or(n),
                };
                (
                    Source::Mooncake(Box::new(reader)),
                    vec![TRACE_CLASS_NAME.to_string()],
                    expected,
                )
            }
            (Some(trace), _) => {
                let reader = TraceReader::open(trace, base_dir)?;
                let size = std::fs::metadata(&reader.path)
                    .map(|m| m.len())
                    .unwrap_or(u64::MAX);
                let rows = if size <= COUNT_ROWS_MAX_BYTES {
                    Some(count_rows(&reader.path)?)
                } else {
                    None
                };
                let expected = match (rows, cfg.num_requests) {
                    (Some(r), Some(n)) => Some(r.min(n)),
                    (r, n) => r.or(n),
                };
                (
                    Source::Trace(Box::new(reader)),
                    vec![TRACE_CLASS_NAME.to_string()],
                    expected,
                )
            }
            (None, Some(arrival)) => {
                let gaps = Self::gaps(arrival)?;
                match (&cfg.multi_turn, &cfg.generated_shared_prefix) {
                    (Some(m), _) => (
                        Source::MultiTurn(Box::new(MultiTurn::new(m, gaps, base_dir, seed)?)),
                        MULTI_TURN_CLASSES.iter().map(|c| c.to_string()).collect(),
                        cfg.num_requests,
                    ),
                    (None, Some(g)) => {
                        let n = u64::from(g.groups) * u64::from(g.prompts_per_group);
                        (
                            Source::SharedPrefix(Box::new(SharedPrefixGen::new(g, gaps, seed))),
                            vec![GSP_CLASS.to_string()],
                            Some(cfg.num_requests.map_or(n, |r| r.min(n))),
                        )
                    }
                    (None, None) => (
                        Source::Synthetic(Box::new(Self::open_synthetic(
                            cfg, gaps, base_dir, seed,
                        )?)),
                        cfg.classes.iter().map(|c| c.name.clone()).collect(),
                        cfg.num_requests,
                    ),
                }
            }
            (None, None) => {
                return Err(WorkloadError::config(
                    "workload.arrival",
                    "missing: give workload.arrival (synthetic) or workload.trace (replay)",
                ))
            }
        };
        Ok(Workload {
            source,
            class_priorities: cfg.classes.iter().map(|c| c.priority).collect(),
            class_n: cfg.classes.iter().map(|c| c.n).collect(),
            class_beam: cfg.classes.iter().map(|c| c.beam_search).collect(),
            class_sampling: cfg
                .classes
                .iter()
                .map(|c| SamplingParams {
                    temperature: c.temperature,
                    top_k: c.top_k,
                    top_p: c.top_p,
                    seed: 0,
                })
                .collect(),
            seed,
            class_names,
            num_requests: cfg.num_requests,
            duration_s: cfg.duration_s,
            expected_len,
            next_id: 0,
            done: false,
        })
    }

    fn gaps(arrival: &ArrivalConfig) -> Result<Gaps, WorkloadError> {
        Ok(match arrival {
            ArrivalConfig::Poisson { rate } => Gaps::Exp(Exp::new(*rate).map_err(|e| {
                WorkloadError::config("workload.arrival.rate", format!("invalid: {e}"))
            })?),
            ArrivalConfig::Gamma { rate, burstiness } => Gaps::Gamma(
                Gamma::new(*burstiness, 1.0 / (rate * burstiness)).map_err(|e| {
                    WorkloadError::config("workload.arrival", format!("invalid gamma: {e}"))
                })?,
            ),
            ArrivalConfig::AllAtOnce {} => Gaps::Zero,
        })
    }

    fn open_synthetic(
        cfg: &WorkloadConfig,
        gaps: Gaps,
        base_dir: &Path,
        seed: u64,
    ) -> Result<Synthetic, WorkloadError> {
        let class_index = WeightedIndex::new(cfg.classes.iter().map(|c| c.weight))
            .map_err(|e| WorkloadError::config("workload.class.weight", format!("{e}")))?;
        let mut classes = Vec::with_capacity(cfg.classes.len());
        for (i, class) in cfg.classes.iter().enumerate() {
            let key = format!("workload.class[{i}]");
            let lengths = match (&class.prompt, &class.output, &class.lengths) {
                (Some(p), Some(o), None) => ClassLengths::Separate(
                    LenSampler::new(p, base_dir, &format!("{key}.prompt"))?,
                    LenSampler::new(o, base_dir, &format!("{key}.output"))?,
                ),
                (None, None, Some(j)) => ClassLengths::Joint(load_counts(
                    &base_dir.join(&j.path),
                    [j.prompt_column.as_str(), j.output_column.as_str()],
                )?),
                _ => {
                    return Err(WorkloadError::config(
                        format!("{key}.prompt"),
                        "give prompt and output, or lengths",
                    ))
                }
            };
            classes.push(ClassSampler {
                lengths,
                prompt_rng: stream(seed, purpose_prompt(i)),
                output_rng: stream(seed, purpose_output(i)),
            });
        }
        Ok(Synthetic {
            prefixes: cfg
                .classes
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    c.shared_prefix
                        .map(|p| (p, stream(seed, 0x2_0000 + i as u64)))
                })
                .collect(),
            gaps,
            t: 0.0,
            arrival_rng: stream(seed, PURPOSE_ARRIVALS),
            class_rng: stream(seed, PURPOSE_CLASS),
            class_index,
            classes,
        })
    }

    /// Names of the classes, indexed by [`Request::class`]; a trace has one class,
    /// `"trace"`.
    pub fn class_names(&self) -> Vec<String> {
        self.class_names.clone()
    }

    /// Expected number of requests, for a progress bar: `num_requests` for a synthetic
    /// workload (`None` when only `duration_s` bounds it); for a trace, its row count
    /// (counted at open for files up to 256 MiB) capped by `num_requests`. With a
    /// `duration_s` cap the true count can be lower.
    pub fn expected_len(&self) -> Option<u64> {
        self.expected_len
    }

    /// Number of trace rows read so far whose output length was 0 and was raised to 1.
    /// Report it as a warning once the iteration has ended; always 0 for synthetic
    /// workloads.
    pub fn clamped_outputs(&self) -> u64 {
        match &self.source {
            Source::Trace(t) => t.clamped_outputs,
            Source::Mooncake(t) => t.clamped_outputs,
            Source::Synthetic(_) | Source::MultiTurn(_) | Source::SharedPrefix(_) => 0,
        }
    }

    /// Number of trace rows read so far whose prompt length was 0 and was raised to 1
    /// (report it as a warning, like [`Workload::clamped_outputs`]).
    pub fn clamped_prompts(&self) -> u64 {
        match &self.source {
            Source::Trace(t) => t.clamped_prompts,
            Source::Mooncake(t) => t.clamped_prompts,
            Source::Synthetic(_) | Source::MultiTurn(_) | Source::SharedPrefix(_) => 0,
        }
    }

    fn next_request(&mut self) -> Result<Option<Request>, WorkloadError> {
        if self.num_requests.is_some_and(|n| self.next_id >= n) {
            return Ok(None);
        }
        let mut prompt_tokens = Vec::new();
        let mut scripted_output = Vec::new();
        let (arrival_s, prompt_len, max_tokens, class) = match &mut self.source {
            Source::MultiTurn(m) => {
                let g = m.next();
                if self.duration_s.is_some_and(|d| g.arrival_s > d) {
                    return Ok(None);
                }
                prompt_tokens = g.prompt;
                scripted_output = g.script;
                let p = u32::try_from(prompt_tokens.len()).unwrap_or(u32::MAX);
                (g.arrival_s, p, g.max_tokens, g.class)
            }
            Source::SharedPrefix(m) => {
                let Some(g) = m.next() else {
                    return Ok(None);
                };
                if self.duration_s.is_some_and(|d| g.arrival_s > d) {
                    return Ok(None);
                }
                prompt_tokens = g.prompt;
                let p = u32::try_from(prompt_tokens.len()).unwrap_or(u32::MAX);
                (g.arrival_s, p, g.max_tokens, g.class)
            }
            Source::Synthetic(s) => {
                let gap = match &s.gaps {
                    Gaps::Exp(d) => d.sample(&mut s.arrival_rng),
                    Gaps::Gamma(d) => d.sample(&mut s.arrival_rng),
                    Gaps::Zero => 0.0,
                };
                let t = s.t + gap;
                if self.duration_s.is_some_and(|d| t > d) {
                    return Ok(None);
                }
                s.t = t;
                let class = if s.classes.len() == 1 {
                    0
                } else {
                    s.class_index.sample(&mut s.class_rng)
                };
                let (mut p, o) = s.classes[class].sample();
                if let Some((prefix, rng)) = s.prefixes.get_mut(class).and_then(Option::as_mut) {
                    let group = rng.random_range(0..prefix.groups.max(1));
                    let id = self.next_id;
                    prompt_tokens = (0..prefix.tokens)
                        .map(|j| synthetic_token(class as u64, u64::from(group), j))
                        .chain((0..p).map(|j| synthetic_token(u64::MAX - id, 0, j)))
                        .collect();
                    p = p.saturating_add(prefix.tokens);
                }
                // validate() caps the class count at u16::MAX + 1.
                (t, p, o, u16::try_from(class).unwrap_or(u16::MAX))
            }
            Source::Trace(r) => match r.next_row()? {
                None => return Ok(None),
                Some(row) => {
                    if self.duration_s.is_some_and(|d| row.arrival_s > d) {
                        return Ok(None);
                    }
                    (row.arrival_s, row.prompt_len, row.max_tokens, 0)
                }
            },
            Source::Mooncake(r) => match r.next_row()? {
                None => return Ok(None),
                Some((t, p, o, tokens)) => {
                    if self.duration_s.is_some_and(|d| t > d) {
                        return Ok(None);
                    }
                    prompt_tokens = tokens;
                    (t, p, o, 0)
                }
            },
        };
        if arrival_s.is_nan() || arrival_s > MAX_ARRIVAL_S {
            let key = match self.source {
                Source::Synthetic(_) | Source::MultiTurn(_) | Source::SharedPrefix(_) => {
                    "workload.arrival.rate"
                }
                Source::Trace(_) | Source::Mooncake(_) => "workload.trace",
            };
            return Err(WorkloadError::Config {
                key: key.into(),
                message: format!(
                    "request {} would arrive at {arrival_s:.3e} s, beyond the simulator's horizon of {MAX_ARRIVAL_S:.0e} s (about 31 years): the rate is too small or the timestamps too far apart",
                    self.next_id
                ),
            });
        }
        let id = self.next_id;
        self.next_id += 1;
        Ok(Some(Request {
            id,
            // Within the horizon the conversion is exact to the nanosecond; rounding keeps
            // the order non-decreasing.
            arrival: (arrival_s * NANOS_PER_SEC).round() as u64,
            prompt_len,
            prompt_tokens,
            max_tokens,
            ignore_eos: true,
            scripted_output,
            n: self.class_n.get(usize::from(class)).copied().unwrap_or(1),
            beam_search: self
                .class_beam
                .get(usize::from(class))
                .copied()
                .unwrap_or(false),
            priority: self
                .class_priorities
                .get(usize::from(class))
                .copied()
                .unwrap_or(0),
            class,
            sampling: SamplingParams {
                seed: splitmix64(self.seed ^ splitmix64(id)),
                ..self
                    .class_sampling
                    .get(usize::from(class))
                    .copied()
                    .unwrap_or_default()
            },
        }))
    }
}

impl Iterator for Workload {
    type Item = Result<Request, WorkloadError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.next_request() {
            Ok(Some(r)) => Some(Ok(r)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

impl std::iter::FusedIterator for Workload {}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const AZURE_CONV: &str = "/work/shared/data/traces/AzureLLMInferenceTrace_conv_2023.csv";
    const SHAREGPT: &str =
        "/work/shared/data/traces/etalon_sharegpt_8k_filtered_stats_llama2_tokenizer.csv";

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Scenario {
        workload: WorkloadConfig,
    }

    fn parse(toml_text: &str) -> Result<WorkloadConfig, toml::de::Error> {
        toml::from_str::<Scenario>(toml_text).map(|s| s.workload)
    }

    fn fixed_class(name: &str, weight: f64) -> ClassConfig {
        ClassConfig {
            name: name.to_string(),
            weight,
            prompt: Some(LengthDist::Fixed { value: 10 }),
            output: Some(LengthDist::Fixed { value: 20 }),
            lengths: None,
            priority: 0,
            shared_prefix: None,
            acceptance: None,
            mean_acceptance_length: None,
            n: 1,
            beam_search: false,
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
        }
    }

    fn synthetic(arrival: ArrivalConfig, n: u64, classes: Vec<ClassConfig>) -> WorkloadConfig {
        WorkloadConfig {
            num_requests: Some(n),
            duration_s: None,
            arrival: Some(arrival),
            trace: None,
            classes,
            multi_turn: None,
            generated_shared_prefix: None,
        }
    }

    fn collect(cfg: &WorkloadConfig, base: &Path, seed: u64) -> Vec<Request> {
        Workload::open(cfg, base, seed)
            .expect("open")
            .collect::<Result<Vec<_>, _>>()
            .expect("requests")
    }

    fn gaps_s(reqs: &[Request]) -> Vec<f64> {
        let mut prev = 0u64;
        reqs.iter()
            .map(|r| {
                let g = (r.arrival - prev) as f64 / NANOS_PER_SEC;
                prev = r.arrival;
                g
            })
            .collect()
    }

    fn mean_std(xs: &[f64]) -> (f64, f64) {
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
        (mean, var.sqrt())
    }

    fn write_file(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        let mut f = File::create(&path).expect("create");
        f.write_all(text.as_bytes()).expect("write");
        path
    }

    #[test]
    fn parses_full_toml() {
        let cfg = parse(
            r#"
            [workload]
            num_requests = 2000
            duration_s = 600.0
            arrival = { process = "gamma", rate = 10, burstiness = 0.5 }
            [[workload.class]]
            name = "chat"
            weight = 3.0
            prompt = { dist = "lognormal", mean = 200.0, std = 150.0, min = 8, max = 2048 }
            output = { dist = "fixed", value = 256 }
            [[workload.class]]
            name = "batch"
            prompt = { dist = "uniform", min = 1, max = 100 }
            output = { dist = "normal", mean = 50.0, std = 5.0 }
            [[workload.class]]
            name = "joint"
            lengths = { path = "x.csv", prompt_column = "a", output_column = "b" }
            "#,
        )
        .expect("parse");
        assert_eq!(cfg.num_requests, Some(2000));
        assert_eq!(
            cfg.arrival,
            Some(ArrivalConfig::Gamma {
                rate: 10.0,
                burstiness: 0.5
            })
        );
        assert_eq!(cfg.classes.len(), 3);
        assert_eq!(cfg.classes[1].weight, 1.0);
        assert_eq!(
            cfg.classes[0].prompt,
            Some(LengthDist::LogNormal {
                mean: 200.0,
                std: 150.0,
                min: Some(8),
                max: Some(2048)
            })
        );
        cfg.validate().expect("valid");
        // Round trip through TOML.
        let text = toml::to_string(&cfg).expect("serialize");
        let back: WorkloadConfig = toml::from_str(&text).expect("reparse");
        assert_eq!(back, cfg);

        let cfg = parse(
            r#"
            [workload]
            trace = { format = "azure", path = "traces/x.csv" }
            arrival = { process = "all-at-once" }
            "#,
        )
        .expect("parse");
        assert_eq!(cfg.trace.as_ref().map(|t| t.time_scale), Some(1.0));
        assert!(cfg.validate().is_err());
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let cases = [
            "[workload]\nnum_requests = 1\nbogus = 1\n",
            "[workload]\narrival = { process = \"poisson\", rate = 1.0, burstiness = 2.0 }\n",
            "[workload]\narrival = { process = \"all-at-once\", rate = 1.0 }\n",
            "[workload]\narrival = { process = \"weibull\", rate = 1.0 }\n",
            "[workload]\ntrace = { format = \"azure\", path = \"x\", speed = 2 }\n",
            "[workload]\ntrace = { format = \"sharegpt\", path = \"x\" }\n",
            "[[workload.class]]\nname = \"a\"\ncolour = \"red\"\n",
            "[[workload.class]]\nname = \"a\"\nprompt = { dist = \"fixed\", value = 3, min = 1 }\n",
            "[[workload.class]]\nname = \"a\"\nlengths = { path = \"x\", prompt_column = \"a\", output_column = \"b\", c = 1 }\n",
        ];
        for case in cases {
            let err = parse(case).expect_err(case);
            let msg = err.to_string();
            assert!(
                msg.contains("unknown") || msg.contains("variant"),
                "{case}: {msg}"
            );
        }
    }

    #[test]
    fn sampling_parameters_reach_requests_with_a_seed_per_request() {
        let mut class = fixed_class("hot", 1.0);
        class.temperature = 0.8;
        class.top_k = 40;
        class.top_p = 0.95;
        let cfg = synthetic(ArrivalConfig::Poisson { rate: 5.0 }, 4, vec![class]);
        let reqs: Vec<Request> = Workload::open(&cfg, Path::new("."), 9)
            .expect("workload")
            .map(|r| r.expect("request"))
            .collect();
        assert_eq!(reqs.len(), 4);
        for r in &reqs {
            assert_eq!(
                (r.sampling.temperature, r.sampling.top_k, r.sampling.top_p),
                (0.8, 40, 0.95)
            );
        }
        // Seeds differ per request and follow the scenario seed.
        assert_ne!(reqs[0].sampling.seed, reqs[1].sampling.seed);
        let again: Vec<u64> = Workload::open(&cfg, Path::new("."), 9)
            .expect("workload")
            .map(|r| r.expect("request").sampling.seed)
            .collect();
        assert_eq!(
            again,
            reqs.iter().map(|r| r.sampling.seed).collect::<Vec<_>>()
        );
        let other = Workload::open(&cfg, Path::new("."), 10)
            .expect("workload")
            .map(|r| r.expect("request").sampling.seed)
            .next();
        assert_ne!(other, Some(reqs[0].sampling.seed));
        // The uniform numbers: in [0, 1), a function of (seed, seq, position, sample).
        let sp = reqs[0].sampling;
        let u = sp.uniform(3, 17, 0);
        assert!((0.0..1.0).contains(&u));
        assert_eq!(u, sp.uniform(3, 17, 0));
        assert_ne!(u, sp.uniform(3, 17, 1));
        assert_ne!(u, sp.uniform(4, 17, 0));
        assert!(!sp.is_greedy());
        let mean = (0..10_000)
            .map(|p| f64::from(sp.uniform(1, p, 0)))
            .sum::<f64>()
            / 1e4;
        assert!((mean - 0.5).abs() < 0.01, "{mean}");
    }

    #[test]
    fn validation_names_keys() {
        let check = |cfg: &WorkloadConfig, key: &str| {
            let err = cfg.validate().expect_err(key).to_string();
            assert!(err.starts_with(key), "expected {key}, got {err}");
        };
        let mut cfg = synthetic(
            ArrivalConfig::Poisson { rate: -3.0 },
            10,
            vec![fixed_class("a", 1.0)],
        );
        assert_eq!(
            cfg.validate().expect_err("rate").to_string(),
            "workload.arrival.rate: must be a positive number, got -3"
        );
        cfg.arrival = Some(ArrivalConfig::Poisson { rate: f64::NAN });
        check(&cfg, "workload.arrival.rate");
        cfg.arrival = Some(ArrivalConfig::Gamma {
            rate: 1.0,
            burstiness: 0.0,
        });
        check(&cfg, "workload.arrival.burstiness");
        cfg.arrival = Some(ArrivalConfig::Poisson { rate: 1.0 });
        cfg.classes[0].weight = 0.0;
        check(&cfg, "workload.class[0].weight");
        cfg.classes[0].weight = 1.0;
        cfg.classes[0].prompt = Some(LengthDist::Uniform { min: 5, max: 4 });
        check(&cfg, "workload.class[0].prompt.min");
        cfg.classes[0].prompt = Some(LengthDist::LogNormal {
            mean: 10.0,
            std: -1.0,
            min: None,
            max: None,
        });
        check(&cfg, "workload.class[0].prompt.std");
        cfg.classes[0].prompt = Some(LengthDist::Fixed { value: 0 });
        check(&cfg, "workload.class[0].prompt.value");
        cfg.classes[0].prompt = Some(LengthDist::Fixed { value: 10 });
        cfg.classes[0].temperature = -0.5;
        check(&cfg, "workload.class[0].temperature");
        cfg.classes[0].temperature = 0.7;
        cfg.classes[0].top_p = 0.0;
        check(&cfg, "workload.class[0].top_p");
        cfg.classes[0].top_p = 1.0;
        assert!(cfg.validate().is_ok());
        cfg.classes[0].prompt = None;
        check(&cfg, "workload.class[0].prompt");
        cfg.classes = vec![fixed_class("a", 1.0), fixed_class("a", 1.0)];
        check(&cfg, "workload.class[1].name");
        cfg.classes.clear();
        check(&cfg, "workload.class");
        cfg.classes = vec![fixed_class("a", 1.0)];
        cfg.num_requests = None;
        check(&cfg, "workload.num_requests");
        cfg.duration_s = Some(10.0);
        cfg.validate().expect("duration alone is enough");
        cfg.arrival = Some(ArrivalConfig::AllAtOnce {});
        check(&cfg, "workload.num_requests");
        cfg.trace = Some(TraceConfig {
            format: TraceFormat::Azure,
            path: "x.csv".into(),
            time_scale: 1.0,
        });
        check(&cfg, "workload.trace");
        cfg.arrival = None;
        check(&cfg, "workload.class");
        cfg.classes.clear();
        cfg.validate().expect("trace alone");
        if let Some(t) = cfg.trace.as_mut() {
            t.time_scale = 0.0;
        }
        check(&cfg, "workload.trace.time_scale");
        cfg.trace = None;
        check(&cfg, "workload.arrival");
    }

    #[test]
    fn poisson_mean_inter_arrival() {
        let rate = 10.0;
        let n = 20_000;
        let cfg = synthetic(
            ArrivalConfig::Poisson { rate },
            n,
            vec![fixed_class("a", 1.0)],
        );
        let reqs = collect(&cfg, Path::new("."), 7);
        assert_eq!(reqs.len() as u64, n);
        let (mean, std) = mean_std(&gaps_s(&reqs));
        let se = (1.0 / rate) / (n as f64).sqrt();
        assert!((mean - 1.0 / rate).abs() < 3.0 * se, "mean {mean}");
        assert!((std * rate - 1.0).abs() < 0.05, "cv {}", std * rate);
        for (i, r) in reqs.iter().enumerate() {
            assert_eq!(r.id, i as u64);
            assert_eq!((r.prompt_len, r.max_tokens, r.class), (10, 20, 0));
            assert!(r.ignore_eos && r.prompt_tokens.is_empty() && r.priority == 0);
        }
        assert!(reqs.windows(2).all(|w| w[0].arrival <= w[1].arrival));
    }

    #[test]
    fn gamma_burstiness_sets_cv() {
        let rate = 10.0;
        let b = 0.25;
        let cfg = synthetic(
            ArrivalConfig::Gamma {
                rate,
                burstiness: b,
            },
            50_000,
            vec![fixed_class("a", 1.0)],
        );
        let reqs = collect(&cfg, Path::new("."), 3);
        let (mean, std) = mean_std(&gaps_s(&reqs));
        let cv = std / mean;
        let expected = 1.0 / f64::sqrt(b);
        assert!((cv - expected).abs() < 0.1 * expected, "cv {cv}");
        assert!((mean * rate - 1.0).abs() < 0.05, "mean {mean}");
    }

    #[test]
    fn duration_stops_arrivals_and_all_at_once() {
        let mut cfg = synthetic(
            ArrivalConfig::Poisson { rate: 100.0 },
            1,
            vec![fixed_class("a", 1.0)],
        );
        cfg.num_requests = None;
        cfg.duration_s = Some(10.0);
        let w = Workload::open(&cfg, Path::new("."), 1).expect("open");
        assert_eq!(w.expected_len(), None);
        let reqs = w.collect::<Result<Vec<_>, _>>().expect("requests");
        assert!((900..1100).contains(&reqs.len()), "{}", reqs.len());
        assert!(reqs.iter().all(|r| r.arrival <= 10_000_000_000));

        let cfg = synthetic(ArrivalConfig::AllAtOnce {}, 50, vec![fixed_class("a", 1.0)]);
        let w = Workload::open(&cfg, Path::new("."), 1).expect("open");
        assert_eq!(w.expected_len(), Some(50));
        let reqs = w.collect::<Result<Vec<_>, _>>().expect("requests");
        assert_eq!(reqs.len(), 50);
        assert!(reqs.iter().all(|r| r.arrival == 0));
    }

    #[test]
    fn lognormal_mean_and_std() {
        let dist = LengthDist::LogNormal {
            mean: 200.0,
            std: 150.0,
            min: None,
            max: None,
        };
        let sampler = LenSampler::new(&dist, Path::new("."), "k").expect("sampler");
        let mut rng = stream(11, 5);
        let xs: Vec<f64> = (0..50_000)
            .map(|_| f64::from(sampler.sample(&mut rng)))
            .collect();
        let (mean, std) = mean_std(&xs);
        assert!((mean - 200.0).abs() < 0.02 * 200.0, "mean {mean}");
        assert!((std - 150.0).abs() < 0.05 * 150.0, "std {std}");

        let clamped = LenSampler::new(
            &LengthDist::LogNormal {
                mean: 200.0,
                std: 150.0,
                min: Some(8),
                max: Some(300),
            },
            Path::new("."),
            "k",
        )
        .expect("sampler");
        assert!((0..10_000)
            .map(|_| clamped.sample(&mut rng))
            .all(|v| (8..=300).contains(&v)));
        // A normal far below zero is still at least 1.
        let low = LenSampler::new(
            &LengthDist::Normal {
                mean: -100.0,
                std: 1.0,
                min: None,
                max: None,
            },
            Path::new("."),
            "k",
        )
        .expect("sampler");
        assert!((0..100).all(|_| low.sample(&mut rng) == 1));
        let uni = LenSampler::new(&LengthDist::Uniform { min: 3, max: 5 }, Path::new("."), "k")
            .expect("sampler");
        let vs: Vec<u32> = (0..1000).map(|_| uni.sample(&mut rng)).collect();
        assert!(vs.iter().all(|v| (3..=5).contains(v)));
        assert!([3, 4, 5].iter().all(|x| vs.contains(x)));
    }

    #[test]
    fn class_weights_proportions() {
        let n = 30_000u64;
        let weights = [3.0, 1.0, 0.5];
        let classes = weights
            .iter()
            .enumerate()
            .map(|(i, &w)| fixed_class(&format!("c{i}"), w))
            .collect();
        let cfg = synthetic(ArrivalConfig::Poisson { rate: 5.0 }, n, classes);
        let w = Workload::open(&cfg, Path::new("."), 99).expect("open");
        assert_eq!(w.class_names(), vec!["c0", "c1", "c2"]);
        let reqs = w.collect::<Result<Vec<_>, _>>().expect("requests");
        let total: f64 = weights.iter().sum();
        for (i, &wt) in weights.iter().enumerate() {
            let p = wt / total;
            let count = reqs.iter().filter(|r| usize::from(r.class) == i).count() as f64;
            let sigma = (n as f64 * p * (1.0 - p)).sqrt();
            assert!(
                (count - n as f64 * p).abs() < 3.0 * sigma,
                "class {i}: {count} vs {}",
                n as f64 * p
            );
        }
    }

    fn mixed_cfg() -> WorkloadConfig {
        synthetic(
            ArrivalConfig::Gamma {
                rate: 4.0,
                burstiness: 0.5,
            },
            1000,
            vec![
                ClassConfig {
                    name: "chat".into(),
                    weight: 2.0,
                    prompt: Some(LengthDist::LogNormal {
                        mean: 200.0,
                        std: 150.0,
                        min: Some(8),
                        max: Some(2048),
                    }),
                    output: Some(LengthDist::Uniform { min: 1, max: 500 }),
                    lengths: None,
                    priority: 0,
                    shared_prefix: None,
                    acceptance: None,
                    mean_acceptance_length: None,
                    n: 1,
                    beam_search: false,
                    temperature: 0.0,
                    top_k: 0,
                    top_p: 1.0,
                },
                ClassConfig {
                    name: "code".into(),
                    weight: 1.0,
                    prompt: Some(LengthDist::Normal {
                        mean: 1000.0,
                        std: 300.0,
                        min: None,
                        max: None,
                    }),
                    output: Some(LengthDist::Fixed { value: 64 }),
                    lengths: None,
                    priority: 0,
                    shared_prefix: None,
                    acceptance: None,
                    mean_acceptance_length: None,
                    n: 1,
                    beam_search: false,
                    temperature: 0.0,
                    top_k: 0,
                    top_p: 1.0,
                },
            ],
        )
    }

    #[test]
    fn determinism() {
        let cfg = mixed_cfg();
        let a = collect(&cfg, Path::new("."), 42);
        let b = collect(&cfg, Path::new("."), 42);
        assert_eq!(a.len(), 1000);
        assert_eq!(a, b);
        let c = collect(&cfg, Path::new("."), 43);
        assert_ne!(a, c);
        assert_ne!(
            a.iter().map(|r| r.arrival).collect::<Vec<_>>(),
            c.iter().map(|r| r.arrival).collect::<Vec<_>>()
        );
        // Streams are independent: changing one class's distribution leaves arrivals,
        // class choices and the other class's lengths unchanged.
        let mut cfg2 = cfg.clone();
        cfg2.classes[1].prompt = Some(LengthDist::Uniform { min: 1, max: 9 });
        let d = collect(&cfg2, Path::new("."), 42);
        for (x, y) in a.iter().zip(&d) {
            assert_eq!((x.arrival, x.class), (y.arrival, y.class));
            if x.class == 0 {
                assert_eq!(x, y);
            }
        }
    }

    #[test]
    fn azure_inline_trace() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_file(
            dir.path(),
            "azure.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n\
             2023-11-16 18:17:03.9799600,4808,10\n\
             2023-11-16 18:17:04.0319600,3180,8\n\
             2023-11-16 18:17:04.0319600,100,0\n\
             2023-11-16 18:17:05.5,7,1\n",
        );
        let cfg = WorkloadConfig {
            num_requests: None,
            duration_s: None,
            arrival: None,
            trace: Some(TraceConfig {
                format: TraceFormat::Azure,
                path: "azure.csv".into(),
                time_scale: 1.0,
            }),
            classes: vec![],
            multi_turn: None,
            generated_shared_prefix: None,
        };
        let mut w = Workload::open(&cfg, dir.path(), 0).expect("open");
        assert_eq!(w.class_names(), vec!["trace"]);
        assert_eq!(w.expected_len(), Some(4));
        let reqs: Vec<Request> = w.by_ref().collect::<Result<_, _>>().expect("rows");
        assert_eq!(w.clamped_outputs(), 1);
        assert_eq!(w.clamped_prompts(), 0);
        let got: Vec<(u64, u64, u32, u32)> = reqs
            .iter()
            .map(|r| (r.id, r.arrival, r.prompt_len, r.max_tokens))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 0, 4808, 10),
                (1, 52_000_000, 3180, 8),
                (2, 52_000_000, 100, 1),
                (3, 1_520_040_000, 7, 1),
            ]
        );
        // time_scale halves the gaps; caps apply.
        let mut cfg2 = cfg.clone();
        if let Some(t) = cfg2.trace.as_mut() {
            t.time_scale = 0.5;
        }
        cfg2.num_requests = Some(3);
        let w = Workload::open(&cfg2, dir.path(), 0).expect("open");
        assert_eq!(w.expected_len(), Some(3));
        let arr: Vec<u64> = w.map(|r| r.expect("row").arrival).collect();
        assert_eq!(arr, vec![0, 26_000_000, 26_000_000]);
        let mut cfg3 = cfg.clone();
        cfg3.duration_s = Some(1.0);
        assert_eq!(
            Workload::open(&cfg3, dir.path(), 0).expect("open").count(),
            3
        );
    }

    #[test]
    fn trace_errors_name_file_line_and_column() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cases = [
            (
                "TIMESTAMP,ContextTokens,GeneratedTokens\n\
                 2023-11-16 18:17:03.9799600,4808,10\n\
                 2023-11-16 18:17:04.0319600,abc,8\n",
                3,
                "ContextTokens",
                "abc",
            ),
            (
                "TIMESTAMP,ContextTokens,GeneratedTokens\n\
                 2023-11-16 18:17:03.9799600,4808,10\n\
                 2023-11-16 18:17:02.0,1,8\n",
                3,
                "TIMESTAMP",
                "2023-11-16 18:17:02.0",
            ),
            (
                "TIMESTAMP,ContextTokens,GeneratedTokens\n\
                 2023-11-16 18:17:03.9799600,4808,10\n\
                 2023-11-16 18:17:04.0,1,8\n\
                 2023-11-16 18:17:05.0,1\n",
                4,
                "GeneratedTokens",
                "",
            ),
            (
                "TIMESTAMP,ContextTokens,GeneratedTokens\n\
                 yesterday,1,2\n",
                2,
                "TIMESTAMP",
                "yesterday",
            ),
            (
                "TIMESTAMP,ContextTokens,GeneratedTokens\n\
                 2023-11-16 18:17:03.9799600,-5,10\n",
                2,
                "ContextTokens",
                "-5",
            ),
        ];
        for (i, (text, line, column, bad)) in cases.into_iter().enumerate() {
            let name = format!("bad{i}.csv");
            write_file(dir.path(), &name, text);
            let cfg = WorkloadConfig {
                num_requests: None,
                duration_s: None,
                arrival: None,
                trace: Some(TraceConfig {
                    format: TraceFormat::Azure,
                    path: name.clone().into(),
                    time_scale: 1.0,
                }),
                classes: vec![],
                multi_turn: None,
                generated_shared_prefix: None,
            };
            let mut w = Workload::open(&cfg, dir.path(), 0).expect("open");
            let err = w
                .by_ref()
                .find_map(|r| r.err())
                .expect("an error")
                .to_string();
            assert!(err.contains(&format!("{name}:{line}:")), "{err}");
            assert!(err.contains(&format!("`{column}`")), "{err}");
            assert!(err.contains(&format!("{bad:?}")), "{err}");
            assert!(w.next().is_none(), "iteration ends after an error");
        }
        // Missing column in the header, and a missing file.
        write_file(dir.path(), "hdr.csv", "TIMESTAMP,ContextTokens\nx,1\n");
        let mut cfg = WorkloadConfig {
            num_requests: None,
            duration_s: None,
            arrival: None,
            trace: Some(TraceConfig {
                format: TraceFormat::Azure,
                path: "hdr.csv".into(),
                time_scale: 1.0,
            }),
            classes: vec![],
            multi_turn: None,
            generated_shared_prefix: None,
        };
        let err = Workload::open(&cfg, dir.path(), 0)
            .expect_err("missing column")
            .to_string();
        assert!(
            err.contains("hdr.csv") && err.contains("GeneratedTokens"),
            "{err}"
        );
        if let Some(t) = cfg.trace.as_mut() {
            t.path = "nope.csv".into();
        }
        let err = Workload::open(&cfg, dir.path(), 0)
            .expect_err("missing file")
            .to_string();
        assert!(err.contains("nope.csv"), "{err}");
    }

    #[test]
    fn vidur_trace() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_file(
            dir.path(),
            "v.csv",
            "arrived_at,num_prefill_tokens,num_decode_tokens,extra\n\
             0.5,100,20,x\n\
             0.75,200,0,y\n\
             2.0,300.0,30,z\n",
        );
        let cfg = WorkloadConfig {
            num_requests: None,
            duration_s: None,
            arrival: None,
            trace: Some(TraceConfig {
                format: TraceFormat::Vidur,
                path: "v.csv".into(),
                time_scale: 2.0,
            }),
            classes: vec![],
            multi_turn: None,
            generated_shared_prefix: None,
        };
        let mut w = Workload::open(&cfg, dir.path(), 0).expect("open");
        let reqs: Vec<Request> = w.by_ref().collect::<Result<_, _>>().expect("rows");
        assert_eq!(w.clamped_outputs(), 1);
        let got: Vec<(u64, u32, u32)> = reqs
            .iter()
            .map(|r| (r.arrival, r.prompt_len, r.max_tokens))
            .collect();
        assert_eq!(
            got,
            vec![
                (1_000_000_000, 100, 20),
                (1_500_000_000, 200, 1),
                (4_000_000_000, 300, 30)
            ]
        );
        write_file(
            dir.path(),
            "v2.csv",
            "arrived_at,num_prefill_tokens,num_decode_tokens\n1.0,1,1\n0.5,1,1\n",
        );
        let mut cfg2 = cfg.clone();
        if let Some(t) = cfg2.trace.as_mut() {
            t.path = "v2.csv".into();
        }
        let err = Workload::open(&cfg2, dir.path(), 0)
            .expect("open")
            .find_map(|r| r.err())
            .expect("error")
            .to_string();
        assert!(
            err.contains("v2.csv:3:") && err.contains("arrived_at"),
            "{err}"
        );
    }

    #[test]
    fn real_azure_conv_trace() {
        let path = Path::new(AZURE_CONV);
        if !path.exists() {
            eprintln!("skipping: {AZURE_CONV} not found");
            return;
        }
        let cfg = WorkloadConfig {
            num_requests: None,
            duration_s: None,
            arrival: None,
            trace: Some(TraceConfig {
                format: TraceFormat::Azure,
                path: path.to_path_buf(),
                time_scale: 1.0,
            }),
            classes: vec![],
            multi_turn: None,
            generated_shared_prefix: None,
        };
        let mut w = Workload::open(&cfg, Path::new("/nonexistent-base"), 0).expect("open");
        assert_eq!(w.expected_len(), Some(19_366));
        let mut n = 0u64;
        let mut prev = 0u64;
        for r in w.by_ref() {
            let r = r.expect("row");
            if n == 0 {
                assert_eq!(r.arrival, 0);
            }
            assert_eq!(r.id, n);
            assert!(r.arrival >= prev);
            assert!(r.prompt_len >= 1 && r.max_tokens >= 1);
            prev = r.arrival;
            n += 1;
        }
        assert_eq!(n, 19_366);
        assert!(prev > 0);
    }

    #[test]
    fn empirical_and_joint_lengths() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_file(dir.path(), "lens.csv", "p,o\n10,1\n20,2\n30,0\n");
        let mut cfg = synthetic(
            ArrivalConfig::Poisson { rate: 1.0 },
            2000,
            vec![
                ClassConfig {
                    name: "emp".into(),
                    weight: 1.0,
                    prompt: Some(LengthDist::Empirical {
                        path: "lens.csv".into(),
                        column: "p".into(),
                        min: None,
                        max: Some(25),
                    }),
                    output: Some(LengthDist::Fixed { value: 5 }),
                    lengths: None,
                    priority: 0,
                    shared_prefix: None,
                    acceptance: None,
                    mean_acceptance_length: None,
                    n: 1,
                    beam_search: false,
                    temperature: 0.0,
                    top_k: 0,
                    top_p: 1.0,
                },
                ClassConfig {
                    name: "joint".into(),
                    weight: 1.0,
                    prompt: None,
                    output: None,
                    lengths: Some(JointLengths {
                        path: "lens.csv".into(),
                        prompt_column: "p".into(),
                        output_column: "o".into(),
                    }),
                    priority: 0,
                    shared_prefix: None,
                    acceptance: None,
                    mean_acceptance_length: None,
                    n: 1,
                    beam_search: false,
                    temperature: 0.0,
                    top_k: 0,
                    top_p: 1.0,
                },
            ],
        );
        let reqs = collect(&cfg, dir.path(), 5);
        let emp: Vec<u32> = reqs
            .iter()
            .filter(|r| r.class == 0)
            .map(|r| r.prompt_len)
            .collect();
        assert!(emp.iter().all(|v| [10, 20, 25].contains(v)));
        assert!([10, 20, 25].iter().all(|v| emp.contains(v)));
        let joint: Vec<(u32, u32)> = reqs
            .iter()
            .filter(|r| r.class == 1)
            .map(|r| (r.prompt_len, r.max_tokens))
            .collect();
        assert!(joint
            .iter()
            .all(|p| [(10, 1), (20, 2), (30, 1)].contains(p)));

        // Missing and empty columns, bad values.
        write_file(dir.path(), "empty.csv", "p,o\n");
        write_file(dir.path(), "bad.csv", "p,o\n1,2\nx,3\n");
        let cases = [
            ("lens.csv", "q", "column `q` not found"),
            ("empty.csv", "p", "has no values"),
            ("bad.csv", "p", "bad.csv:3: column `p`"),
        ];
        for (file, column, expected) in cases {
            cfg.classes[0].prompt = Some(LengthDist::Empirical {
                path: file.into(),
                column: column.into(),
                min: None,
                max: None,
            });
            let err = Workload::open(&cfg, dir.path(), 5)
                .expect_err(expected)
                .to_string();
            assert!(err.contains(file) && err.contains(expected), "{err}");
        }
    }

    #[test]
    fn real_sharegpt_joint_lengths() {
        let path = Path::new(SHAREGPT);
        if !path.exists() {
            eprintln!("skipping: {SHAREGPT} not found");
            return;
        }
        let cfg = synthetic(
            ArrivalConfig::Poisson { rate: 10.0 },
            5000,
            vec![ClassConfig {
                name: "sharegpt".into(),
                weight: 1.0,
                prompt: None,
                output: None,
                lengths: Some(JointLengths {
                    path: path.to_path_buf(),
                    prompt_column: "num_prefill_tokens".into(),
                    output_column: "num_decode_tokens".into(),
                }),
                priority: 0,
                shared_prefix: None,
                acceptance: None,
                mean_acceptance_length: None,
                n: 1,
                beam_search: false,
                temperature: 0.0,
                top_k: 0,
                top_p: 1.0,
            }],
        );
        let reqs = collect(&cfg, Path::new("."), 1);
        assert_eq!(reqs.len(), 5000);
        assert!(reqs.iter().all(|r| r.prompt_len >= 1 && r.max_tokens >= 1));
        let distinct: std::collections::HashSet<u32> = reqs.iter().map(|r| r.prompt_len).collect();
        assert!(distinct.len() > 100);
        // Prompt and output come from the same row: total of the pair must be a row
        // total in the file (checked for the first few).
        let rows = load_counts(path, ["num_prefill_tokens", "num_decode_tokens"]).expect("rows");
        for r in reqs.iter().take(50) {
            assert!(rows
                .iter()
                .any(|[p, o]| (*p).max(1) == r.prompt_len && (*o).max(1) == r.max_tokens));
        }
    }
}
